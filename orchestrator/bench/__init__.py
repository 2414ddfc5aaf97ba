"""`inferno bench`: a streaming load generator for any OpenAI-compatible server, with same-run baselines
(the backend driven in-process, a bare aiohttp SSE server) and the server's CPU per streamed token.

See docs/benchmarking.md for the commands and what each number means.
"""
