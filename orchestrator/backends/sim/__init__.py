"""A simulated GPU engine: TensorRT-LLM's in-flight batching on a paged KV cache, timed by a fitted step-time
model instead of run on a GPU (the `sim` backend, orchestrator/backends/sim/backend.py, drives it).

Pure parts, each its own module and tested with plain values: the simulated GPUs (`gpus`), the model's
memory arithmetic (`memory`), the step-time model (`step_time`), the engine folder's parameters (`spec`), the
refcounted KV block pool with prefix reuse (`blocks`), the token stream of one sequence (`sequence`,
`corpus`), admission and step scheduling (`batching`), and the engine that ties them together (`engine`).
`device` is the simulated GPU's memory as the server's memory ledger sees it. See docs/simulation.md.
"""
