"""Test double of the `tensorrt_llm` package (TensorRT-LLM 1.2.1), for Inferno's tests only.

The real package cannot be installed where the tests run (it needs NVIDIA GPUs and CUDA 13). This folder
stands in for it when it is put first on PYTHONPATH: `tensorrt_llm.bindings.executor` is the double of the
C++ Executor's Python bindings (see that module), `bin/executorWorker` the placeholder of the worker binary
orchestrator mode spawns, and `__version__` the version the double claims to be.
"""

__version__ = "1.2.1"
