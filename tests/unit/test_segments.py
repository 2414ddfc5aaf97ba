"""The segment cache (text/segments.py): a prompt tokenised piece by piece, its long pieces from the cache, has the
ids the tokenizer gives it whole, for every text, cold or warm, and for tokenizers of other shapes; pieces are
reused only within one scope (a key's); tokenizers whose pieces may not be independent get no cache; it holds
no more than its capacity."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from orchestrator.text import segments
from orchestrator.text.segments import MIN_PROMPT_CHARS, MIN_SEGMENT_CHARS, SegmentCache

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.fixture(scope="module")
def embedded(default_engine) -> Tokenizer:
    return Tokenizer.from_file(str(default_engine / "tokenizer.json"))


def reshaped(tokenizer: Tokenizer, pre_tokenizer=None, normalizer=None, added=()) -> Tokenizer:
    copy = Tokenizer.from_str(tokenizer.to_str())
    if pre_tokenizer is not None:
        copy.pre_tokenizer = pre_tokenizer
    copy.normalizer = normalizer
    copy.add_tokens(list(added))
    return copy


def whole(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def encoded(cache: SegmentCache, tokenizer: Tokenizer, text: str, salt: str = "key") -> list[int] | None:
    with segments.scope(salt):
        return cache.encode(text, lambda piece: whole(tokenizer, piece))


SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
fragment = st.one_of(
    st.sampled_from(SPECIALS),
    st.sampled_from([" ", "\n", "\n\n", "  ", "\t", "'s", "123456", "é", "👋", "<|", "|>", "<|im_", "system\n",
                     "user\n", "<tool>", "</tool>"]),
    st.text(min_size=1, max_size=40),
    st.builds(lambda word, n: word * n, st.text(min_size=1, max_size=8), st.integers(60, 200)),
)


_SHAPED: dict[str, Tokenizer] = {}


def shaped(embedded: Tokenizer, shape: str) -> Tokenizer:
    """The embedded default's tokenizer, or one like it in the ways tokenizers differ (made once per shape)."""
    if shape not in _SHAPED:
        _SHAPED[shape] = _make(embedded, shape)
    return _SHAPED[shape]


def _make(embedded: Tokenizer, shape: str) -> Tokenizer:
    return {
        "embedded": lambda: embedded,
        "llama3-split": lambda: reshaped(embedded, pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])),
        "normalised": lambda: reshaped(embedded, normalizer=normalizers.NFKC()),
        # a special token that takes the whitespace before it, and an added token that begins with a special one
        "added": lambda: reshaped(embedded, added=[AddedToken("<tool>", lstrip=True, special=True, normalized=False),
                                                   AddedToken("<|im_start|>user", normalized=False)]),
        "metaspace-first": metaspace_first,
    }[shape]()


def metaspace_first() -> Tokenizer:
    """A small BPE whose pre-tokenizer marks a word with ▁ and the text's first piece too (Llama 2's, Mistral's)."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    corpus = [LONG, "You answer in one short sentence, plainly. Hello world 123 é 👋 'tis system user", *SPECIALS]
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", *SPECIALS]))
    return tokenizer


SHAPES = ["embedded", "llama3-split", "normalised", "added", "metaspace-first"]
LONG = "Rain on the tin roof, " * 100


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("text", [
    LONG + "   <tool>" + LONG + " <tool>\n" + LONG + "<|im_end|>\n",  # whitespace that <tool> takes
    "<|im_start|>user\n" + LONG + "<|im_end|>\n<|im_start|>user\n" + LONG + "<|im_end|>",
    LONG + "<|im_end|>\u0301" + LONG + "<|im_end|>  \n\n" + LONG + "  ",  # a combining mark after a cut
    LONG + "<|im_end|><|im_start|><|endoftext|>" + LONG,  # cuts side by side
])
def test_where_pieces_meet_the_ids_are_those_of_the_whole(embedded, shape, text):
    tokenizer = shaped(embedded, shape)
    cache = SegmentCache(tokenizer)
    for _ in range(2):  # cold, then warm
        assert encoded(cache, tokenizer, text) == whole(tokenizer, text)
    assert cache.hit_tokens > 0


@pytest.mark.parametrize("shape", SHAPES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(fragment, min_size=1, max_size=60))
def test_a_prompt_cut_into_pieces_has_the_ids_of_the_whole(embedded, shape, fragments):
    tokenizer = shaped(embedded, shape)
    cache = SegmentCache(tokenizer)
    assert cache.problem is None
    text = "".join(fragments)
    text = text if len(text) >= MIN_PROMPT_CHARS else text + "<|im_end|>" + "padding words " * 160
    expected = whole(tokenizer, text)
    assert encoded(cache, tokenizer, text) == expected  # cold: every long piece tokenised and kept
    assert encoded(cache, tokenizer, text) == expected  # warm: every long piece from the cache
    assert encoded(cache, tokenizer, "<|im_start|>" + text) == whole(tokenizer, "<|im_start|>" + text)


def conversation(*messages: str) -> str:
    return "".join(f"<|im_start|>user\n{m}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"


def test_a_long_piece_is_tokenised_once_per_scope_and_only_in_one(embedded):
    cache = SegmentCache(embedded)
    system, first, second = "You are terse. " * 200, "Write a haiku about rain. " * 40, "Now one about snow."
    assert len(first) > MIN_SEGMENT_CHARS and len(system) > MIN_PROMPT_CHARS
    turn_one, turn_two = conversation(system, first), conversation(system, first, second)
    assert encoded(cache, embedded, turn_one) == whole(embedded, turn_one)
    tail = "<|im_end|>\n<|im_start|>assistant\n"  # after the last segment: cut where a message ends
    assert cache.hit_tokens == 0 and cache.miss_tokens == len(whole(embedded, turn_one)) - len(whole(embedded, tail))
    assert encoded(cache, embedded, turn_two) == whole(embedded, turn_two)
    assert cache.hit_tokens == cache.miss_tokens  # both long pieces found, the short new one tokenised as it stands

    found = cache.hit_tokens
    assert encoded(cache, embedded, turn_two, salt="another key") == whole(embedded, turn_two)
    assert cache.hit_tokens == found  # another scope finds nothing of the first's
    assert cache.encode(turn_two, lambda piece: whole(embedded, piece)) is None  # outside any scope: not used
    assert encoded(cache, embedded, conversation("short")) is None  # a short prompt is tokenised whole


def test_a_tokenizer_whose_pieces_are_not_independent_gets_no_cache(embedded, monkeypatch):
    word = reshaped(embedded, added=[AddedToken("<w>", single_word=True, normalized=False)])
    cache = SegmentCache(word)
    assert "as a word" in cache.problem
    assert encoded(cache, word, conversation("x " * MIN_PROMPT_CHARS)) is None
    monkeypatch.setattr(segments, "INDEPENDENT", segments.INDEPENDENT - {"ByteLevel"})  # a pre-tokenizer not known
    assert "ByteLevel" in SegmentCache(embedded).problem


def test_the_cache_keeps_no_more_tokens_than_its_capacity(embedded, monkeypatch):
    monkeypatch.setattr(segments, "CAPACITY_TOKENS", 4_000)
    cache = SegmentCache(embedded)
    for n in range(12):
        text = conversation(f"Message {n}: " + "words and more words " * 120, "tail " * 150)
        assert encoded(cache, embedded, text) == whole(embedded, text)
        assert cache._tokens <= 4_000 and cache._tokens == sum(len(ids) for ids in cache._entries.values())
    assert encoded(cache, embedded, text) == whole(embedded, text) and cache.hit_tokens > 0  # the newest stayed
