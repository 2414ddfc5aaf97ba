"""Dev-only benchmarks, run from a checkout and not part of the wheel. The general benchmark is `inferno bench`
(orchestrator/bench/, shipped; docs/benchmarking.md); what is here builds on it or stands beside it:

- `python -m bench.baselines`: `inferno bench` with the backend driven in-process (inprocess.py) and a bare
  aiohttp SSE server (sse_server.py) as same-run baselines;
- `python -m bench.swap`: two models that do not fit together taking turns;
- `python -m bench.soak`: mixed traffic for a long time, does anything grow without bound (soak/);
- specialists: `python -m bench.sim` (the sim backend alone against its model's prediction),
  `python -m bench.grammar` (structured-output costs), `python -m bench.socket_floor` (the kernel's floor
  per write), `python -m bench.health_latency` (/health while the biggest prompts are processed),
  `python -m bench.llamacpp_compare` and `python -m bench.llamacpp_sampling` (against llama.cpp's own server
  and sampler).

Results are JSON under bench/results/."""
