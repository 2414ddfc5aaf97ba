"""The socket-floor benchmark writes what it says to every connection (the reader gets every byte) and accounts
CPU per write."""

from __future__ import annotations

import json

from bench.socket_floor import CHUNK, main, measure


def test_every_write_is_counted_and_costs_some_cpu():
    result = measure(sockets=4, rounds=50, tick_s=0.0)
    assert result["writes"] == 200 and result["chunk_bytes"] == len(CHUNK)
    assert result["bytes_read"] == 200 * len(CHUNK)  # every write reached the reader
    assert result["us_per_write"] == round(result["user_us_per_write"] + result["system_us_per_write"], 2)
    assert result["us_per_write"] >= 0


def test_the_result_goes_to_a_json_file(tmp_path, capsys):
    assert main(["--sockets", "2", "--rounds", "3", "--tick-ms", "0", "--out", str(tmp_path)]) == 0
    [path] = tmp_path.glob("socket-floor-*.json")
    saved = json.loads(path.read_text())
    assert saved["writes"] == 6 and "µs of CPU per write" in capsys.readouterr().out
