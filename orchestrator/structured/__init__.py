"""Structured outputs and tool calling: constraints on what a model may generate, enforced by a grammar
(docs/structured-outputs.md).

The files here are light and run in the HTTP process (schemas, tool parsing, the checker's client); the ones that
import xgrammar (and with it torch and transformers) are in `grammar/` and run only in the grammar checker's
process and in workers.
"""
