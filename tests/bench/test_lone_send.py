"""bench/lone_send.py: every timed write reaches the reader, whichever socket, reader and sender it is told to use."""

from __future__ import annotations

import json

import pytest

from bench.lone_send import CHUNK, main, measure


@pytest.mark.parametrize(("unix", "spin", "busy"), [(False, False, False), (True, True, True)])
def test_every_send_reaches_the_reader_and_is_timed(unix, spin, busy):
    result = measure(30, 0.001, unix=unix, spin_reader=spin, busy_sender=busy)
    assert result["bytes_read"] == 30 * len(CHUNK)  # the reader got every write, so each send was a whole one
    assert result["socket"] == ("unix" if unix else "tcp") and result["reader"] == ("spin" if spin else "select")
    assert result["sender"] == ("busy" if busy else "sleep") and result["us_per_send"] > 0


def test_it_prints_one_json_line(capsys):
    assert main(["--sends", "5", "--gap-ms", "0", "--unix"]) == 0
    assert json.loads(capsys.readouterr().out)["sends"] == 5
