"""Long prompts are encoded through the tokenizer's GIL-releasing call; the ids are the same either way."""

from __future__ import annotations

from orchestrator.text.prompt import GIL_FREE_CHARS, PromptEncoder


def test_long_and_short_prompts_encode_as_the_tokenizer_does(default_engine):
    prompts = PromptEncoder(default_engine)
    for text in ("Hello there, how are you?", "The quick brown fox. " * (GIL_FREE_CHARS // 10)):
        for special in (True, False):
            assert prompts.encode_text(text, special) == prompts.tokenizer.encode(text, add_special_tokens=special).ids
    chat = [{"role": "user", "content": "Tell me a story. " * (GIL_FREE_CHARS // 8)}]
    assert len(prompts.encode_chat(chat)) > GIL_FREE_CHARS // 4


def test_a_tokenizer_that_truncates_or_pads_does_not_cut_or_pad_a_prompt(default_engine, tmp_path):
    """Some tokenizer.json files set truncation (and padding) for the model's training; a prompt is never cut or
    padded here: one too long is refused with context_length_exceeded, naming both lengths."""
    import json

    config = json.loads((default_engine / "tokenizer.json").read_text())
    config["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    config["padding"] = {"strategy": {"Fixed": 4096}, "direction": "Right", "pad_to_multiple_of": None,
                         "pad_id": 0, "pad_type_id": 0, "pad_token": "<|endoftext|>"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(config))
    text = "The quick brown fox jumps over the lazy dog. " * 30
    expected = PromptEncoder(default_engine).encode_text(text, False)
    assert len(expected) > 8 and PromptEncoder(tmp_path).encode_text(text, False) == expected
