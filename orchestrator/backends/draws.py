"""The integer hash both the hf and the llamacpp backends draw sampled tokens with: a uniform number derived only
from (the request's seed, the token's position), so that the same seed and prompt give the same tokens whatever
else the batch holds."""

from __future__ import annotations

_MASK64 = 0xFFFFFFFFFFFFFFFF
KEY_RANGE = float(1 << 31)  # a key's uniform number is (key + 0.5) / KEY_RANGE


def draw_key(seed: int, position: int) -> int:
    """A 31-bit key for one sampling step of one sequence (splitmix64 finaliser); key / 2**31 is its uniform."""
    x = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & 0x7FFFFFFF
