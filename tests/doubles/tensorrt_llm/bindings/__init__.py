"""Test double of `tensorrt_llm.bindings` (TensorRT-LLM 1.2.1): only its `executor` module is doubled."""
