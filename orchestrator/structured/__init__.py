"""Structured outputs and tool calling: constraints on what a model may generate, enforced by a grammar
(docs/structured-outputs.md).

Files that import xgrammar (and with it torch and transformers): `compile.py`, `lowering.py`,
`checker_process.py`, `matcher.py`; they run only in the grammar checker's process and in workers.
Everything else here is light and safe for the HTTP process.
"""
