"""The text simulated answers are made of: a few paragraphs of ordinary English, tokenized once per load
with the engine folder's own tokenizer, so the ids are real and detokenising them costs what real text costs.
"""

from __future__ import annotations

from tokenizers import Tokenizer

CORPUS = """\
The harbour town wakes slowly in winter. Before the sun clears the hills, the bakery on the corner has
already filled its windows with bread, and the smell drifts down to the water where the fishing boats knock
gently against the pier. A few people walk their dogs along the sea wall, nodding to each other without
speaking, as if the morning were something fragile that a loud word might break.

By nine o'clock the market square is busy. Farmers from the valley sell apples, potatoes, cheese and honey
from the backs of their vans, and the woman who runs the flower stall calls out prices in a voice that
carries across the whole square. Children on their way to school stop to look at the puppies in a cardboard
box, and their parents pull them along with promises about the weekend.

The library opens at ten. It is an old stone building with tall windows and a wooden floor that creaks in
the same places it has creaked for a hundred years. The librarian knows most of her visitors by name. She
keeps a shelf near the door for books that people have returned with notes tucked inside them: shopping
lists, train tickets, a postcard from a cousin in another country, once a pressed leaf from a tree that no
longer grows in the park.

In the afternoon the wind usually turns, and the light over the bay becomes soft and grey. This is when the
older men gather outside the cafe to play cards and argue about the weather, the price of fuel and the
football results. They have been having the same arguments for decades, and none of them expects to win.
What matters is that the game goes on, that the coffee is hot, and that someone remembers to bring a spare
deck in case the wind steals a card.

Evenings are quiet. Lights come on one by one in the houses along the hill, and the sound of the sea grows
louder as the streets empty. Somebody is always practising the piano in the blue house near the church,
slowly, making the same mistake in the same bar and starting again. Nobody complains. In a small town you
learn to be patient with other people's work, because sooner or later they will have to be patient with
yours.

Travellers who stay for a week often say that nothing happens here. They are right, in a way, and they are
also missing the point. The town is not a place where things happen; it is a place where things continue.
The tide comes in and goes out, the bread is baked, the books are borrowed and returned, and the piano
player gets a little better every month, whether or not anyone is listening.
"""


def corpus_tokens(tokenizer: Tokenizer, end_tokens: frozenset[int]) -> tuple[int, ...]:
    """The corpus as this tokenizer's ids, without end tokens (those end a sequence; they are not text)."""
    ids = tokenizer.encode(CORPUS, add_special_tokens=False).ids
    tokens = tuple(token for token in ids if token not in end_tokens)
    if not tokens:
        raise ValueError("the tokenizer turns the simulator's text corpus into no tokens")
    return tokens
