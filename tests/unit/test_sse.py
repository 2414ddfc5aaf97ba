"""Pre-rendered chunk templates give byte for byte what the general chunk renderer gives (for the non-empty text
they are used for: an empty text sends no chunk)."""

from __future__ import annotations

import pytest

from orchestrator.api.completions_format import Format
from orchestrator.api.sse import ChunkTemplates, sse
from orchestrator.engine.request import EngineRequest
from orchestrator.lifecycle import Choice, InferenceRequest

CHAT = Format("chat.completion", "chat.completion.chunk", chat=True, system_fingerprint="fp_x")
TEXT = Format("text_completion", "text_completion", chat=False)
TEXTS = ["Hello", ' "quoted" ', "line\nbreak\ttab", "caf\u00e9 \U0001f389 \u65e5\u672c", "\\", "\x00\x1f", "\ud7ff"]


def request(n: int = 2) -> InferenceRequest:
    choices = [Choice(i, EngineRequest(f"r.{i}", (1,), 5)) for i in range(n)]
    return InferenceRequest(id="cmpl-1", model="m", prompt_tokens=1, choices=choices, stream=True)


@pytest.mark.parametrize("fmt", [CHAT, TEXT])
@pytest.mark.parametrize("include_usage", [False, True])
def test_templates_match_the_renderer(fmt, include_usage):
    req = request()
    templates = ChunkTemplates(lambda index, text: fmt.chunk(req, 1700000000, index, text, include_usage=include_usage))
    for index in (0, 1):
        for text in TEXTS:
            expected = sse(fmt.chunk(req, 1700000000, index, text, include_usage=include_usage))
            assert templates.text(index, text) == expected
