"""`inferno bench`: a streaming load generator for any OpenAI-compatible server, with the server's CPU per
streamed token.

See docs/benchmarking.md for the commands and what each number means. The dev-only scenarios built on it
(soak, swap, the in-process and bare-SSE baselines) live in the repository's bench/ folder, not in the package.
"""
