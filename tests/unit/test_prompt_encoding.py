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
