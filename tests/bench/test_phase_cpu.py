"""bench/phase_cpu.py: the request path's phases timed on the main thread, a coroutine only as it runs."""

from __future__ import annotations

import asyncio
import inspect
import time

import pytest

from bench import phase_cpu


@pytest.fixture
def window():
    phase_cpu.WINDOW.start()
    yield phase_cpu.WINDOW
    phase_cpu.WINDOW.open = False


@pytest.mark.parametrize(("role", "module", "path", "top"), phase_cpu.PHASES)
def test_every_phase_names_a_function_of_the_path(role, module, path, top):
    _, _, function = phase_cpu.resolve(module, path)
    assert inspect.isfunction(function), f"{module}.{path} is not a function now: the table needs a new name"


def _spin(seconds: float) -> None:
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def test_a_coroutine_is_counted_while_it_runs_and_not_while_others_run_as_it_waits(window):
    async def phase(resumed: asyncio.Event):
        _spin(0.02)
        await resumed.wait()  # meanwhile another task spends 0.06 s of this thread's CPU

    async def other(resumed: asyncio.Event):
        _spin(0.06)
        resumed.set()

    async def go():
        resumed = asyncio.Event()
        await asyncio.gather(phase_cpu.timed(phase, "phase")(resumed), other(resumed))

    asyncio.run(go())
    assert window.calls["phase"] == 1
    assert 0.02 <= window.seconds["phase"] < 0.05  # its own 0.02 s; timing the whole span would count 0.08


def test_a_function_is_counted_with_its_calls_and_nothing_outside_the_window(window):
    add = phase_cpu.timed(lambda a, b: a + b, "add")
    assert add(1, 2) == 3
    window.open = False
    assert add(3, 4) == 7
    assert window.calls["add"] == 1


def test_the_report_is_per_request_with_the_rest_of_the_thread_outside_the_top_level_phases():
    handler, top, inner = "RequestHandler._handle_request", "Channel._write_gathered", "prepare_generation"
    result = {"pid": 1, "main_thread_s": 0.01, "process_s": 0.012, "wall_s": 1.0,
              "phases": {handler: [10, 0.006], top: [5, 0.001], inner: [10, 0.002]}}
    http = phase_cpu.report({"http": [result]}, osl=100)["http"]
    assert (http["requests"], http["main_thread_us_per_request"]) == (10, 1000)
    assert http["main_thread_us_per_token"] == 10
    assert http["rest_of_thread_us_per_request"] == 300  # 10 - 6 - 1 (the handler holds prepare_generation)
    assert http["phases"][inner] == {"us_per_request": 200, "calls_per_request": 1}


def test_roles_are_read_from_command_lines():
    assert phase_cpu.role_of("/v/bin/python -m orchestrator serve --engines-dir e") == "http"
    assert phase_cpu.role_of("/v/bin/inferno serve") == "http"
    assert phase_cpu.role_of("/v/bin/python -m orchestrator.worker --fd 5") == "worker"
    assert phase_cpu.role_of("/v/bin/inferno bench --url u") is None
