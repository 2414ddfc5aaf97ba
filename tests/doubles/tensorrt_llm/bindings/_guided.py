"""Guided decoding in the test double, with the real xgrammar: a grammar compiled over the vocabulary the
executor was configured with (GuidedDecodingConfig), and the double's "model" choosing among the tokens it allows.

As in TensorRT-LLM 1.2 (reference §8), a request's grammar is compiled when the request is admitted, with no
per-request error handling: a grammar that fails to compile fails every request of the batch.

Under a grammar the double prefers, in order: an end token when the grammar may end, a few structural characters
(a quote, a closing bracket, a digit, a comma, an opening bracket) so that JSON opens and closes quickly, the
prompt's next token, then the lowest allowed token id. So constrained outputs are short, valid and deterministic.
"""

from __future__ import annotations

PREFERRED = ('"', "}", "]", "0", ",", ":", "{", "[", "a", " ")


class GuidedVocabulary:
    """The compiler over the executor's GuidedDecodingConfig, built once per executor."""

    def __init__(self, config):
        import xgrammar as xgr

        if config.backend.name != "XGRAMMAR":
            raise RuntimeError("the TensorRT engine runtime supports only the XGRAMMAR guided decoding backend")
        if not config.encoded_vocab:
            raise RuntimeError("GuidedDecodingConfig needs the encoded vocabulary")
        encoded = list(config.encoded_vocab)
        # As the C++ guided decoder builds it: the vocabulary type detected from the tokenizer's JSON.
        metadata = xgr.TokenizerInfo._detect_metadata_from_hf(config.tokenizer_str or "")
        info = xgr.TokenizerInfo(encoded, metadata["vocab_type"], stop_token_ids=list(config.stop_token_ids or []),
                                 add_prefix_space=metadata["add_prefix_space"])
        self._xgr = xgr
        self._compiler = xgr.GrammarCompiler(info)
        self.vocab_size = info.vocab_size
        self.preferred = [encoded.index(text) for text in PREFERRED if text in encoded]

    def matcher(self, guide_type: str, guide: str | None):
        compile_by_type = {
            "JSON": lambda: self._compiler.compile_builtin_json_grammar(),
            "JSON_SCHEMA": lambda: self._compiler.compile_json_schema(guide),
            "REGEX": lambda: self._compiler.compile_regex(guide),
            "EBNF_GRAMMAR": lambda: self._compiler.compile_grammar(guide),
            "STRUCTURAL_TAG": lambda: self._compiler.compile_structural_tag(guide),
        }
        return GuidedChoice(self, self._xgr.GrammarMatcher(compile_by_type[guide_type]()))


class GuidedChoice:
    """One request's grammar state and its choice of next token."""

    def __init__(self, vocabulary: GuidedVocabulary, matcher):
        self._vocabulary = vocabulary
        self._matcher = matcher
        self._bitmask = vocabulary._xgr.allocate_token_bitmask(1, vocabulary.vocab_size)

    def choose(self, scores: dict[int, float], end_id: int | None) -> int:
        """The next token: the best-scored allowed one, by the preference order in the module docstring."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        allowed = self._allowed

        if end_id is not None and end_id >= 0 and allowed(end_id):
            return end_id
        for token in self._vocabulary.preferred:
            if allowed(token):
                return token
        for token in sorted(scores, key=lambda t: -scores[t]):
            if scores[token] > 0 and allowed(token):
                return token
        return next(token for token in range(self._vocabulary.vocab_size) if allowed(token))

    def _allowed(self, token: int) -> bool:
        word = int(self._bitmask[0, token // 32])
        return bool((word >> (token % 32)) & 1)

    def accept(self, token: int) -> None:
        if not self._matcher.accept_token(token):
            raise RuntimeError(f"the grammar refused token {token}")
