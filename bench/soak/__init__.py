"""The soak scenario: a long run of mixed traffic against real servers, watching that nothing grows without
bound. Streams, non-streaming requests, streams the client cuts, invalid requests, model swaps (by traffic
and through the admin API) and probes, all at once; the RSS, open fds and threads of every server process
and the HTTP process's asyncio tasks sampled over time; a table, a plot and a verdict.

    python -m bench.soak [--duration-s 1800] [--sample-s 5] [--seed 0] [--engines-dir engines]
                         [--model smollm2-135m | --no-hf] [--out bench/results]

`make soak` runs it. The command is __main__.py, the run run.py, its servers servers.py, the traffic
traffic.py (requests.py, bad_requests.py, control.py; counted by tally.py), the samples sampler.py, the
verdict series.py and verdict.py, the table and plot report.py. It drives the servers with `inferno bench`'s
HTTP client (orchestrator/bench/); docs/benchmarking.md says how to read a run.
"""
