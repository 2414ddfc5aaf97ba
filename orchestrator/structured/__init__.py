"""Structured outputs and tool calling: constraints on what a model may generate, enforced by a grammar.

Files that import xgrammar (and with it torch): `compile.py`, `checker_process.py`, `matcher.py`,
`bench_grammar.py`. Everything else here is light and safe for the HTTP process.
"""
