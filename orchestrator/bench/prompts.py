"""Prompt texts of a given length in tokens: exact where the model's tokenizer is at hand, else approximate.

A prompt is a seeded sequence of common English words, different for every request from its first word,
so prefix caches do not turn a benchmark into a cache test. With the tokenizer (an engine folder, or
--tokenizer DIR), words that are one token each are drawn and the count is checked the way the server
counts it (chat template included for chat) and corrected until it is exact.
"""

from __future__ import annotations

import random
from pathlib import Path

from orchestrator.bench.workload import RequestSpec

_WORD_TEXT = """the of and to in is that for it as was with be by on not he this are or his from at which but have
an had they you were their one all we can her has there been if more when will would who so no time people
year way day man thing woman life child world school state family student group country problem hand part
place case week company system program question work government number night point home water room mother
area money story fact month lot right study book eye job word business issue side kind head house service
friend father power hour game line end member law car city community name president team minute idea kid body
information back parent face others level office door health person art war history party result change
morning reason research girl guy moment air teacher force education foot boy age policy music market sense
nation plan college interest death experience effect use class control care field development role effort
rate heart drug show leader light voice wife police mind price report decision son view relationship town road
arm difference value building action model season society tax director position player record paper space
ground form event official matter center couple site project activity star table need court oil situation
cost industry figure street image phone data picture practice piece land product doctor wall patient worker
news test movie north love support technology step baby computer type attention film tree source organization
hair window evidence population truth song"""
WORDS = tuple(_WORD_TEXT.split())

MAX_ADJUSTMENTS = 32


class PromptMaker:
    """Makes prompt texts for one model and endpoint. `exact` says whether lengths are checked with the
    model's own tokenizer; `method` says how, for the result file."""

    def __init__(self, tokenizer_dir: Path | None, chat: bool):
        self.exact = tokenizer_dir is not None
        self._count = None
        self._words = WORDS
        if tokenizer_dir is None:
            self.method = "approximate: one common English word per token (no tokenizer at hand)"
            return
        from orchestrator.text.prompt import PromptEncoder

        encoder = PromptEncoder(tokenizer_dir)
        if chat:
            self._count = lambda text: len(encoder.encode_chat([{"role": "user", "content": text}]))
            how = "the chat template and tokenizer"
        else:
            self._count = lambda text: len(encoder.encode_text(text))
            how = "the tokenizer"
        single = [w for w in WORDS if len(encoder.tokenizer.encode(" " + w, add_special_tokens=False).ids) == 1]
        self._words = single or WORDS
        self.minimum = self._count(self._words[0])
        self.method = f"exact: counted with {how} of {tokenizer_dir}"

    def make(self, isl: int, rng: random.Random) -> str:
        """A prompt of `isl` tokens (approximately, when not `exact`). Raises ValueError when `isl` is below
        what any prompt costs on this endpoint (special tokens, the chat template)."""
        if self._count is None:
            return " ".join(rng.choices(self._words, k=isl))
        if isl < self.minimum:
            raise ValueError(f"--isl {isl} is below the {self.minimum} tokens any prompt takes on this endpoint")
        words = rng.choices(self._words, k=max(1, isl - (self.minimum - 1)))
        for _ in range(MAX_ADJUSTMENTS):
            count = self._count(" ".join(words))
            if count == isl:
                return " ".join(words)
            if count > isl:
                del words[max(1, len(words) - (count - isl)) :]
            else:
                words += rng.choices(self._words, k=isl - count)
        raise ValueError(f"could not make a prompt of exactly {isl} tokens (the closest had {count})")


def prompts_for(specs: list[RequestSpec], makers: dict[str, PromptMaker], seed: int) -> list[str]:
    """One prompt per request, each from its own generator (seed, request index)."""
    return [makers[s.model].make(s.isl, random.Random(seed * 1_000_003 + s.index)) for s in specs]
