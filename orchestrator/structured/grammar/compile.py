"""Compiling a guide with xgrammar over a model's real vocabulary: the one place that maps guide kinds to
xgrammar calls, the same calls TensorRT-LLM 1.2's C++ guided decoder makes (CompileJSONSchema with its
defaults, CompileRegex, CompileGrammar, CompileStructuralTag).

Imports xgrammar, hence torch and transformers: only the grammar checker's process and workers use it.
"""

from __future__ import annotations

import re
import time

import numpy as np
import xgrammar as xgr

from orchestrator.structured.grammar.lowering import structural_tag_as_ebnf
from orchestrator.structured.vocabulary import Vocabulary

XGRAMMAR_VERSION = "0.1.25"  # the version TensorRT-LLM 1.2 pins; compile results must agree with the engine's
_LOG_PREFIX = re.compile(r"^\s*\[[0-9:.\- ]+\]\s*\S+?:\d+:\s*")
MAX_REASON_CHARS = 500  # xgrammar may quote the whole grammar back
_CHECK_FAILED = re.compile(r"Check failed: .*? is false: ")


class GrammarRefused(Exception):
    """xgrammar could not compile the guide; `reason` is its message without log decoration."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def tokenizer_info(vocabulary: Vocabulary) -> xgr.TokenizerInfo:
    """TokenizerInfo as TensorRT-LLM builds it: vocabulary type and prefix space detected from the tokenizer
    JSON, the logits width as vocab_size, the model's end tokens as stop tokens."""
    metadata = xgr.TokenizerInfo._detect_metadata_from_hf(vocabulary.tokenizer_json)
    return xgr.TokenizerInfo(list(vocabulary.encoded), metadata["vocab_type"], vocab_size=vocabulary.size,
                             stop_token_ids=list(vocabulary.stop_token_ids),
                             add_prefix_space=metadata["add_prefix_space"])


def new_compiler(
    vocabulary: Vocabulary, *, threads: int = 1, cache: bool = True, cache_limit_bytes: int = -1
) -> xgr.GrammarCompiler:
    """A compiler over `vocabulary`; with `cache`, compiled grammars are kept up to `cache_limit_bytes`
    (-1: no limit)."""
    return xgr.GrammarCompiler(tokenizer_info(vocabulary), max_threads=threads, cache_enabled=cache,
                               cache_limit_bytes=cache_limit_bytes)


def compile_guide(compiler: xgr.GrammarCompiler, kind: str, text: str) -> xgr.CompiledGrammar:
    """Compile one guide given in its compiled form (`Guide.compiled_form()`); GrammarRefused if xgrammar
    refuses it."""
    try:
        if kind == "json_schema":
            return compiler.compile_json_schema(text)
        if kind == "regex":
            return compiler.compile_regex(text)
        if kind == "ebnf":
            return compiler.compile_grammar(text)
        if kind == "structural_tag":
            return compiler.compile_structural_tag(text)
    except Exception as exc:  # xgrammar raises RuntimeError and its subclasses, ValueError, TypeError
        raise GrammarRefused(clean_reason(exc)) from exc
    raise GrammarRefused(f"unknown guide kind {kind!r}")


def clean_reason(exc: BaseException) -> str:
    """xgrammar's message without the timestamp, source location and assertion text its C++ checks add."""
    lines = [
        _CHECK_FAILED.sub("", _LOG_PREFIX.sub("", line)).strip() for line in str(exc).strip().splitlines()
    ]
    reason = " ".join(line for line in lines if line) or type(exc).__name__
    return reason if len(reason) <= MAX_REASON_CHARS else reason[: MAX_REASON_CHARS - 3] + "..."


def check_guide(compiler: xgr.GrammarCompiler, kind: str, text: str) -> xgr.CompiledGrammar:
    """What the grammar checker runs: compile the guide, and for a structural tag also its EBNF lowering
    (lowering.py), so either form can be handed to TensorRT-LLM. GrammarRefused if either fails; else the
    compiled guide."""
    compiled = compile_guide(compiler, kind, text)
    if kind == "structural_tag":
        try:
            lowered = structural_tag_as_ebnf(text)
        except Exception as exc:
            raise GrammarRefused(f"its EBNF form could not be made: {clean_reason(exc)}") from exc
        try:
            compile_guide(compiler, "ebnf", lowered)
        except GrammarRefused as exc:
            raise GrammarRefused(f"its EBNF form does not compile: {exc.reason}") from exc
    return compiled


def mask_cost_ms(compiled: xgr.CompiledGrammar, steps: int) -> float:
    """The mean time to fill one row's token bitmask, in ms, along a sample walk of up to `steps` steps: at
    each step the mask is filled (timed) and the lowest allowed token that does not end the output is
    accepted, so the walk stays inside the grammar where a decoder spends its steps."""
    info = compiled.tokenizer_info
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    stops = set(info.stop_token_ids)
    spent, filled = 0.0, 0
    for _ in range(steps):
        started = time.process_time()  # CPU time of this (checker) process: a busy machine does not inflate it
        matcher.fill_next_token_bitmask(bitmask, 0)
        spent += time.process_time() - started
        filled += 1
        allowed = np.flatnonzero(np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little"))
        token = next((int(t) for t in allowed[: info.vocab_size] if int(t) not in stops), None)
        if token is None or not matcher.accept_token(token):
            break
    return spent * 1000 / max(filled, 1)
