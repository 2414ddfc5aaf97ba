"""From a soak run's samples to its verdict: one row per judged series, and the quiet-period checks.

Judged series, per server: the HTTP process's RSS, open fds, threads and event-loop tasks; and the RSS, open
fds and threads of every worker that stayed loaded all through (the same pid from the idle baseline to the
end), since a worker that a swap replaced has no long series to judge. Those are summarised instead (how
many processes, their peaks).

Samples are tagged by phase: `warmup`, `baseline` (quiet, after the warm-up: the idle baseline), `traffic`
(the series that are judged for growth) and `quiet` (after traffic: back to idle?).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict

from bench.soak.verdict import RETURN_SLACK, TOLERANCES, Tolerance, judge_growth, judge_return

PROCESS_METRICS = ("rss_bytes", "fds", "threads")
UNITS = {"rss_bytes": "bytes", "fds": "count", "threads": "count", "tasks": "count"}


def value_of(server_sample: dict, pid: int, metric: str) -> float | None:
    if metric == "tasks":
        return server_sample.get("tasks")
    for process in server_sample["processes"]:
        if process["pid"] == pid:
            return process[metric]
    return None


def series(samples: list[dict], server: str, pid: int, metric: str, phase: str) -> tuple[list[float], list[float]]:
    """(times, values) of one process's metric over the samples of one phase; samples without it left out."""
    times, values = [], []
    for sample in samples:
        if sample["phase"] != phase:
            continue
        value = value_of(sample["servers"][server], pid, metric)
        if value is not None:
            times.append(sample["t"])
            values.append(value)
    return times, values


def _pids(server_sample: dict, prefix: str) -> dict[int, str]:
    return {p["pid"]: p["role"] for p in server_sample["processes"] if p["role"].startswith(prefix)}


def steady_processes(samples: list[dict], server: str) -> list[tuple[str, int]]:
    """(role, pid) of the HTTP process and of each worker present in every sample from the idle baseline on."""
    judged = [s["servers"][server] for s in samples if s["phase"] in ("baseline", "traffic", "quiet")]
    if not judged:
        return []
    steady = _pids(judged[0], "")
    for server_sample in judged[1:]:
        present = _pids(server_sample, "")
        steady = {pid: role for pid, role in steady.items() if present.get(pid) == role}
    return sorted(((role, pid) for pid, role in steady.items() if role == "http" or role.startswith("worker:")),
                  key=lambda item: (item[0] != "http", item[0]))


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _settled(values: list[float]) -> float | None:
    """A quiet period's value: its lowest sample. A connection the client has just closed can still be open
    on the server's side in the first sample of the period; a leaked fd or a task left behind is in every one."""
    return min(values) if values else None


def _thirds(values: list[float]) -> list[float | None]:
    third = len(values) // 3
    if not third:
        return [None, None, None]
    return [_median(values[: len(values) - 2 * third]), _median(values[-2 * third : -third]), _median(values[-third:])]


def judge_series(samples: list[dict], server: str, role: str, pid: int, metric: str,
                 tolerance: Tolerance, slack: float | None) -> dict:
    unit = UNITS[metric]
    times, values = series(samples, server, pid, metric, "traffic")
    growth = judge_growth(times, values, tolerance, unit)
    baseline = _settled(series(samples, server, pid, metric, "baseline")[1])
    end = _settled(series(samples, server, pid, metric, "quiet")[1])
    returned = None
    if slack is not None:
        returned = (judge_return(baseline, end, slack, unit) if baseline is not None and end is not None else None)
    passed = growth.passed and (slack is None or (returned is not None and returned.passed))
    return {
        "server": server, "process": role, "pid": pid, "metric": metric, "unit": unit,
        "tolerance": tolerance.describe(unit), "baseline": baseline, "thirds": _thirds(values),
        "peak": max(values) if values else None, "end": end, "growth": asdict(growth),
        "back_to_idle": None if slack is None else (asdict(returned) if returned else {"passed": False,
                                                     "reason": "no idle sample before or after traffic"}),
        "passed": passed,
    }


def quiet_checks(samples: list[dict], server: str) -> list[dict]:
    """Once traffic stopped: nothing in flight, the same number of child processes as at the idle baseline."""
    checks = []
    for phase in ("baseline", "quiet"):
        in_flight = [s["servers"][server].get("in_flight") for s in samples if s["phase"] == phase]
        passed = bool(in_flight) and all(value == 0 for value in in_flight)
        checks.append({"server": server, "check": f"requests in flight while {phase}", "values": in_flight,
                       "passed": passed})
    children = {phase: [s["servers"][server]["children"] for s in samples if s["phase"] == phase]
                for phase in ("baseline", "quiet")}
    before, after = _median(children["baseline"]), _median(children["quiet"])
    checks.append({"server": server, "check": "child processes back to the idle baseline",
                   "values": [before, after], "passed": before is not None and after == before})
    return checks


def transient_processes(samples: list[dict], server: str, steady: set[int]) -> list[dict]:
    """Per role, the processes that did not stay all through (swapped workers, spares): how many, their peaks."""
    by_role: dict[str, dict] = {}
    for sample in samples:
        for process in sample["servers"][server]["processes"]:
            if process["pid"] in steady:
                continue
            entry = by_role.setdefault(process["role"], {"pids": set(), "rss_bytes": 0, "fds": 0, "threads": 0})
            entry["pids"].add(process["pid"])
            for metric in PROCESS_METRICS:
                entry[metric] = max(entry[metric], process[metric])
    return [{"server": server, "process": role, "processes": len(entry["pids"]),
             **{f"peak_{metric}": entry[metric] for metric in PROCESS_METRICS}}
            for role, entry in sorted(by_role.items())]


def verdict(samples: list[dict], pinned: dict[str, list[str]], checks: list[dict] = (),
            tolerances: dict[str, Tolerance] = TOLERANCES, slack: dict[str, float] = RETURN_SLACK) -> dict:
    """Every judged series, the quiet checks, the transient processes, and whether all passed. `pinned`:
    per server, the models whose worker must have stayed the same process all through; `checks`: the run's
    own (`{"server", "check", "values", "passed"}`), judged with these."""
    servers = sorted(samples[0]["servers"]) if samples else []
    rows, checks, transient = [], list(checks), []
    for server in servers:
        steady = steady_processes(samples, server)
        roles = {role for role, _ in steady}
        for model in pinned.get(server, []):
            checks.append({"server": server, "check": f"{model}'s worker stayed the same process all through",
                           "values": [], "passed": f"worker:{model}" in roles})
        for role, pid in steady:
            metrics = (*PROCESS_METRICS, "tasks") if role == "http" else PROCESS_METRICS
            for metric in metrics:
                rows.append(judge_series(samples, server, role, pid, metric, tolerances[metric], slack.get(metric)))
        checks += quiet_checks(samples, server)
        transient += transient_processes(samples, server, {pid for _, pid in steady})
    passed = bool(rows) and all(row["passed"] for row in rows) and all(check["passed"] for check in checks)
    return {"passed": passed, "rows": rows, "checks": checks, "transient": transient,
            "tolerances": {metric: t.describe(UNITS[metric]) for metric, t in tolerances.items()},
            "return_slack": slack}
