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


def test_the_special_tokens_a_tokenizer_adds_around_a_text_come_around_its_pieces(default_engine, tmp_path):
    """A tokenizer whose post-processor adds a token before every text and one after (a BOS, an EOS): a completion's
    prompt, tokenised piece by piece in a key's scope, has the tokenizer's own ids, those two included."""
    import json

    from orchestrator.text import segments

    config = json.loads((default_engine / "tokenizer.json").read_text())
    config["post_processor"] = {
        "type": "TemplateProcessing", "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
        "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
        "special_tokens": {name: {"id": name, "ids": [config["model"]["vocab"][name]], "tokens": [name]}
                           for name in ("<|endoftext|>", "<|im_end|>")},
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(config))
    prompts = PromptEncoder(tmp_path)
    for text in ("Once upon a time, 3 foxes", "", "<|im_start|>user\nhi<|im_end|>", "naïve café"):
        expected = prompts.tokenizer.encode(text, add_special_tokens=True).ids
        with segments.scope("key"):
            assert prompts.encode_text(text) == expected
        assert expected[0] != expected[-1] and len(expected) >= 2
    assert prompts.pieces._scopes["key"]  # the ASCII texts' pieces were found and kept


def test_a_tokenizer_says_it_goes_piece_by_piece_once_its_pieces_are_made_and_serve(default_engine, tmp_path):
    """What decides whether a prompt is prepared on the event loop (api/body.py: off_loop)."""
    import json

    prompts = PromptEncoder(default_engine)
    assert not prompts.by_pieces  # not made yet: the first prompt makes them, on a thread
    prompts.encode_text("hello there", False)
    assert prompts.by_pieces
    warmed = PromptEncoder(default_engine)
    warmed.warm()  # what the server does on a thread while its models load (server.py)
    assert warmed.by_pieces and "longest_token_chars" in warmed.__dict__
    assert warmed.longest_token_chars == max(map(len, warmed.tokenizer.get_vocab(with_added_tokens=True)))
    config = json.loads((default_engine / "tokenizer.json").read_text())
    config["model"]["dropout"] = 0.1  # a shape the pieces do not serve
    (tmp_path / "tokenizer.json").write_text(json.dumps(config))
    other = PromptEncoder(tmp_path)
    other.encode_text("hello there", False)
    assert other.pieces.problem and not other.by_pieces
