"""The engine-thread gap benchmark on the embedded default: it measures a gap per request and every part asked."""

from __future__ import annotations

import json

from bench import llamacpp_gap


def test_the_gap_between_decodes_is_measured_with_its_parts(gguf_engine, capsys):
    assert llamacpp_gap.main(["--engine", str(gguf_engine), "--requests", "2", "--tokens", "8", "--parts"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["requests"]) == 2
    for request in report["requests"]:
        assert request["decode_ms_p50"] > 0 and request["gap_us_p50"] > 0
        assert {"_sample", "_fill_batch", "_deliver", "step", "send"} <= set(request["parts_us_p50"])
        assert all(value > 0 for value in request["prompt_ms"].values())
        assert request["parts_us_max"].keys() == request["parts_us_p50"].keys()
        assert all(request["parts_us_max"][name] >= p50 for name, p50 in request["parts_us_p50"].items())
