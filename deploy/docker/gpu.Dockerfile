# syntax=docker/dockerfile:1
# Inferno for NVIDIA GPUs on the official TensorRT-LLM container. The tag is the TensorRT-LLM version the
# trtllm backend targets (pyproject.toml's `trtllm` extra): change both together. Engines are not in the
# image: they are built ahead of time (`inferno build`) into a volume mounted at /engines. From the
# repository root:
#   docker build -f deploy/docker/gpu.Dockerfile -t inferno:gpu .
#   docker run --rm --gpus all --ipc host --ulimit memlock=-1 --ulimit stack=67108864 -p 127.0.0.1:8000:8000 \
#     -v "$PWD/engines:/engines" -v "$PWD/deploy/keys.toml:/etc/inferno/keys.toml:ro" inferno:gpu
# It runs as the unprivileged user inferno (uid 10001), and needs API keys: a keys file mounted at
# /etc/inferno/keys.toml (deploy/README.md says how to make keys); without one it refuses to start.

FROM nvcr.io/nvidia/tensorrt-llm/release:1.2.1
# The base image's Python is the system one; installing into it is what this image is for.
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_BREAK_SYSTEM_PACKAGES=1
WORKDIR /opt/inferno/src
COPY pyproject.toml README.md ./
COPY orchestrator orchestrator
COPY build_scripts build_scripts
# The HTTP process's dependencies only: tensorrt_llm, torch and CUDA come with the base image, and the hf
# extra's transformers pin would fight TensorRT-LLM's own. Fail the build if the base's version drifts.
RUN pip install . \
 && python -c "from importlib.metadata import version; v = version('tensorrt_llm'); assert v == '1.2.1', v"
RUN useradd --create-home --uid 10001 inferno \
 && mkdir -p /var/lib/inferno && chown inferno:inferno /var/lib/inferno
ENV INFERNO=inferno \
    INFERNO_HOST=0.0.0.0 \
    INFERNO_PORT=8000 \
    INFERNO_ENGINES_DIR=/engines \
    INFERNO_AUTH__KEYS_FILE=/etc/inferno/keys.toml \
    INFERNO_DATA_DIR=/var/lib/inferno \
    INFERNO_DRAIN_TIMEOUT_S=30
VOLUME ["/engines"]
USER inferno
EXPOSE 8000
STOPSIGNAL SIGTERM
ENTRYPOINT ["inferno"]
CMD ["serve"]
