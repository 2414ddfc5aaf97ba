"""Specialist benchmarks: `python -m bench.sim` (the sim backend alone against its model's prediction) and
`python -m bench.grammar` (structured-output costs). The general benchmark is `inferno bench`
(orchestrator/bench/, docs/benchmarking.md). Results are JSON under bench/results/."""
