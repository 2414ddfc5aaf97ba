"""The `hf` backend: transformers' continuous batching on PyTorch (runs in a worker process; imports torch)."""
