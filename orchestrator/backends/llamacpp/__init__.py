"""The `llamacpp` backend: GGUF files on llama.cpp's C API (runs in a worker process; `api.py` is every llama.cpp call)."""
