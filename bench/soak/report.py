"""A soak run's table (plain text for the terminal, markdown for the file) and its plot: every series over
time, per server and process, with the phases shaded. The plot needs matplotlib (`pip install
'inferno[bench]'`); without it the plot is skipped with a note."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.soak.series import UNITS, value_of

MiB = 2**20
HEADER = ("server", "process", "metric", "idle before", "traffic 1/3", "2/3", "3/3", "peak", "idle after",
          "rise (fit)", "allowed", "verdict")
METRIC_NAMES = {"rss_bytes": "RSS MiB", "fds": "open fds", "threads": "threads", "tasks": "asyncio tasks"}
PHASE_COLOURS = {"warmup": "#eeeeee", "baseline": "#d8ecd8", "traffic": None, "quiet": "#d8ecd8"}


def _cell(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "bytes":
        return f"{value / MiB:.1f}"
    return f"{value:.1f}".removesuffix(".0")


def table_rows(verdict: dict) -> list[tuple[str, ...]]:
    rows = []
    for row in verdict["rows"]:
        unit, growth = row["unit"], row["growth"]
        process = row["process"] if row["process"] == "http" else f"{row['process']} ({row['pid']})"
        rows.append((
            row["server"], process, METRIC_NAMES[row["metric"]], _cell(row["baseline"], unit),
            *(_cell(v, unit) for v in row["thirds"]), _cell(row["peak"], unit), _cell(row["end"], unit),
            _cell(growth["fitted_rise"], unit), _cell(growth["allowed"], unit), "pass" if row["passed"] else "FAIL",
        ))
    return rows


def text_table(verdict: dict) -> str:
    cells = [HEADER, *table_rows(verdict)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    return "\n".join("  ".join(c[i].rjust(widths[i]) for i in range(len(HEADER))) for c in cells)


def _markdown_table(header: tuple[str, ...], rows: list[tuple]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def failed_reasons(verdict: dict) -> list[str]:
    """One line per series or check that failed, with its reason."""
    lines = []
    for row in verdict["rows"]:
        if row["passed"]:
            continue
        why = [row["growth"]["reason"]] if not row["growth"]["passed"] else []
        if row["back_to_idle"] is not None and not row["back_to_idle"]["passed"]:
            why.append(row["back_to_idle"]["reason"])
        lines.append(f"{row['server']} {row['process']} {row['metric']}: {'; '.join(why)}")
    lines += [f"{c['server']}: {c['check']}: {c['values']}" for c in verdict["checks"] if not c["passed"]]
    return lines


TIMELINE_METRICS = ("rss_bytes", "fds", "tasks")
SHORT = {"rss_bytes": "RSS", "fds": "fds", "tasks": "tasks"}


def _slices(samples: list[dict], traffic_slices: int) -> list[tuple[str, list[dict]]]:
    """The samples by phase, the traffic cut into `traffic_slices` runs of about equal length."""
    slices = []
    for phase in ("warmup", "baseline", "traffic", "quiet"):
        chosen = [s for s in samples if s["phase"] == phase]
        count = traffic_slices if phase == "traffic" else 1
        size = -(-len(chosen) // count) if chosen else 0
        slices += [(phase, chosen[i : i + size]) for i in range(0, len(chosen), size or 1)]
    return slices


def timeline(report: dict, traffic_slices: int = 10) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The judged processes' RSS (MiB), fds and tasks, and each server's requests in flight, as medians over
    stretches of the run: the warm-up, the idle baseline, tenths of the traffic, the idle end."""
    samples, rows = report["samples"], report["verdict"]["rows"]
    columns = [(r["server"], r["process"], r["pid"], r["metric"]) for r in rows if r["metric"] in TIMELINE_METRICS]
    servers = sorted({server for server, *_ in columns})
    header = ("phase", "minutes", *(f"{s} {p.split(':')[-1]} {SHORT[m]}" for s, p, _, m in columns),
              *(f"{s} in flight" for s in servers))
    table = []
    for phase, chosen in _slices(samples, traffic_slices):
        cells = [phase, f"{chosen[0]['t'] / 60:.1f}-{chosen[-1]['t'] / 60:.1f}"]
        for server, _, pid, metric in columns:
            values = [v for v in (value_of(s["servers"][server], pid, metric) for s in chosen) if v is not None]
            cells.append(_cell(statistics.median(values), UNITS[metric]) if values else "-")
        for server in servers:
            values = [s["servers"][server]["in_flight"] for s in chosen if s["servers"][server]["in_flight"] is not None]
            cells.append(_cell(statistics.median(values), "count") if values else "-")
        table.append(tuple(cells))
    return header, table


def markdown(report: dict) -> str:
    """The whole result as markdown: what ran, the table, the checks, the traffic, the verdict."""
    verdict, traffic = report["verdict"], report["traffic"]
    lines = [f"# Soak run {report['started_at']}", "",
             f"{report['duration_s']:g} s of traffic (seed {report['seed']}, a sample every {report['sample_s']:g} s), "
             f"on {report['machine']['cpus']} CPUs ({report['machine']['cpu_model']}).", "",
             f"**Verdict: {'nothing grew without bound' if verdict['passed'] else 'FAILED'}**; "
             f"{traffic['failures']} request(s) failed.", "",
             "Sizes in MiB. Growth is judged on the traffic period's last two thirds; idle before and after are "
             "the medians of the quiet samples after the warm-up and after the traffic.", ""]
    lines += _markdown_table(HEADER, table_rows(verdict))
    lines += ["", "## Over time", "", "Medians over each stretch of the run (RSS in MiB).", ""]
    lines += _markdown_table(*timeline(report))
    lines += ["", "## Checks", ""]
    lines += _markdown_table(("server", "check", "values", "verdict"),
                             [(c["server"], c["check"], c["values"], "pass" if c["passed"] else "FAIL")
                              for c in verdict["checks"]])
    lines += ["", "## Processes that came and went", ""]
    lines += _markdown_table(("server", "process", "processes", "peak RSS MiB", "peak fds", "peak threads"),
                             [(t["server"], t["process"], t["processes"], f"{t['peak_rss_bytes'] / MiB:.1f}",
                               t["peak_fds"], t["peak_threads"]) for t in verdict["transient"]])
    lines += ["", "## Traffic", ""]
    rows = [(server, kind, c["sent"], c["ok"], ", ".join(f"{k}: {v}" for k, v in c["notes"].items()) or "-",
             ", ".join(f"{k}: {v}" for k, v in c["failures"].items()) or "-")
            for server, kinds in traffic["servers"].items() for kind, c in kinds.items()]
    lines += _markdown_table(("server", "kind", "sent", "ok", "of which", "failures"), rows)
    lines += ["", "## Server logs", ""]
    for server, facts in report["servers"].items():
        problems = facts["log_problems"]
        lines.append(f"- {server}: {problems['count']} entries at ERROR level or with a traceback")
        lines += [f"  - `{entry.splitlines()[0]}` ... `{entry.splitlines()[-1]}`" for entry in problems["first"]]
    reasons = failed_reasons(verdict)
    if reasons:
        lines += ["", "## What failed", "", *(f"- {line}" for line in reasons)]
    if report.get("plot"):
        lines += ["", f"![soak]({Path(report['plot']).name})"]
    return "\n".join(lines) + "\n"


def _lines(samples: list[dict]) -> dict[tuple[str, str], dict[str, list]]:
    """(server, role) -> metric -> values aligned with the samples (None where that role had no process).
    Roles held by one process after another (swapped workers) make one line with gaps."""
    keys = sorted({(server, p["role"]) for s in samples for server, one in s["servers"].items()
                   for p in one["processes"]})
    lines = {key: {m: [] for m in ("rss_bytes", "fds", "threads")} for key in keys}
    for sample in samples:
        for (server, role), metrics in lines.items():
            found = [p for p in sample["servers"][server]["processes"] if p["role"] == role]
            for metric, values in metrics.items():
                values.append(sum(p[metric] for p in found) if found else None)
    return lines


ROWS = (("rss_bytes", "resident memory (MiB)"), ("fds", "open file descriptors"), ("threads", "threads"),
        ("tasks", "HTTP process asyncio tasks"), ("in_flight", "requests in flight (server)"))


def plot(samples: list[dict], path: Path) -> str | None:
    """Writes `path`, a column per server and a row per metric; returns a note instead when matplotlib is
    missing or there are no samples."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'inferno[bench]')"
    if not samples:
        return "no plot: no samples"
    servers = sorted(samples[0]["servers"])
    minutes = [s["t"] / 60 for s in samples]
    figure, axes = plt.subplots(len(ROWS), len(servers), figsize=(7 * len(servers), 15), sharex=True, squeeze=False)
    lines = _lines(samples)
    for column, server in enumerate(servers):
        for row, (metric, title) in enumerate(ROWS):
            axis = axes[row][column]
            if metric in ("tasks", "in_flight"):
                values = [s["servers"][server].get(metric) for s in samples]
                axis.plot(minutes, [float("nan") if v is None else v for v in values], label="http", linewidth=1)
            else:
                scale = MiB if metric == "rss_bytes" else 1
                for (owner, role), metrics in lines.items():
                    if owner == server:
                        values = [float("nan") if v is None else v / scale for v in metrics[metric]]
                        axis.plot(minutes, values, label=role, linewidth=1)
            _shade_phases(axis, samples)
            axis.set_title(f"{server}: {title}", fontsize="medium")
            axis.grid(True, alpha=0.3)
            axis.legend(fontsize="x-small", ncol=2, loc="upper left")
        axes[-1][column].set_xlabel("minutes (grey: warm-up, green: quiet)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return None


def _shade_phases(axis, samples: list[dict]) -> None:
    start = 0
    for index in range(1, len(samples) + 1):
        if index == len(samples) or samples[index]["phase"] != samples[start]["phase"]:
            colour = PHASE_COLOURS.get(samples[start]["phase"])
            if colour:
                end = samples[index]["t"] if index < len(samples) else samples[-1]["t"]
                axis.axvspan(samples[start]["t"] / 60, end / 60, color=colour, zorder=0)
            start = index
