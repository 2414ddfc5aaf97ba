"""The `trtllm` backend: TensorRT-LLM 1.2's C++ Executor (runs in a worker process; imports tensorrt_llm)."""
