"""bench/worker_step.py drives the worker's own step over attached streams: every token is written to its client
(none goes back to the server as a row), and --no-send writes nothing."""

from __future__ import annotations

import json

from bench.worker_step import PREFIX, SUFFIX, main


def test_every_token_is_written_to_its_stream_and_none_is_sent_as_a_row(default_engine, capsys):
    assert main(["--engine", str(default_engine), "--streams", "4", "--steps", "25", "--tick-ms", "0"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tokens"] == 100 and result["rows_sent_to_server"] == 0
    # each chunk is at least its event's fixed text and framing; a token's text may be held back (a split character)
    assert result["bytes_read"] >= 90 * len("data: " + PREFIX + SUFFIX)
    assert result["us_per_token"] == round(result["user_us_per_token"] + result["system_us_per_token"], 2)


def test_without_sending_nothing_reaches_the_reader(default_engine, capsys):
    assert main(["--engine", str(default_engine), "--streams", "2", "--steps", "10", "--tick-ms", "0", "--no-send"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["bytes_read"] == 0 and result["rows_sent_to_server"] == 0 and not result["send"]
