"""Inferno: an OpenAI-compatible LLM inference server, a thin orchestrator over TensorRT-LLM."""

__version__ = "0.1.0"
