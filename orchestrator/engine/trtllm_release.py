"""The TensorRT-LLM release Inferno builds engines with and serves them on: one place for the build and the runtime.

1.2 is the last line with the TensorRT engine path (trtllm-build) and the Executor's configuration bindings; the
build's flags and the adapter's names were checked against 1.2 sources (tests/trtllm/tensorrt_llm_1_2_facts.toml).
"""

from __future__ import annotations

LINE = "1.2."  # any 1.2.x release
VERSION = "1.2.1"  # the pinned release
CONTAINER = f"nvcr.io/nvidia/tensorrt-llm/release:{VERSION}"
# The xgrammar the release's guided decoding is built with: the 1.2 line's Python pin (requirements.txt); the commit
# compiled into its C++ runtime is not stated there (tests/trtllm/tensorrt_llm_1_2_facts.toml, "guided decoding").
XGRAMMAR_VERSION = "0.1.25"
PACKAGE_INDEX = "https://pypi.nvidia.com"
INSTALL_HINT = (
    f"install it from NVIDIA's package index (pip install --extra-index-url {PACKAGE_INDEX} "
    f"tensorrt_llm=={VERSION}) or run Inferno in the official container {CONTAINER} "
    "(the project's GPU image, deploy/docker/gpu.Dockerfile, builds on it)"
)
