"""The xgrammar importers: compiling guides, the per-request matcher, the grammar checker process. Runs in a
worker or in the checker process, never in the HTTP process (tests/unit/test_light_imports.py)."""
