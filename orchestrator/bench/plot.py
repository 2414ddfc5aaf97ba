"""A PNG of latency against load: TTFT and ITL (p50 and p99) over output throughput, one line per series.
Needs matplotlib (`pip install 'inferno[bench]'`); without it the plot is skipped with a note."""

from __future__ import annotations

from pathlib import Path


def _label(load: dict) -> str:
    (key, value), = load.items()
    return {"concurrency": f"c={value}", "rate": f"{value:g}/s"}.get(key, "trace")


def plot(rows: list[dict], path: Path) -> str | None:
    """Writes `path`; returns a note instead when matplotlib is missing or there is nothing to draw."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'inferno[bench]')"
    series = sorted({row["series"] for row in rows})
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    drawn = False
    for name in series:
        points = sorted((r for r in rows if r["series"] == name and r["output_tok_s"]), key=lambda r: r["output_tok_s"])
        if not points:
            continue
        drawn = True
        x = [r["output_tok_s"] for r in points]
        for axis, metric in zip(axes, ("ttft_s", "itl_s"), strict=True):
            for q, style in (("p50", "-o"), ("p99", "--x")):
                # A latency of 0 (chunks read together) has no place on a log axis: left out.
                y = [r[metric][q] * 1000 if r[metric][q] else float("nan") for r in points]
                axis.plot(x, y, style, label=f"{name} {q}")
            for row, value in zip(points, x, strict=True):
                if row[metric]["p50"]:
                    axis.annotate(_label(row["load"]), (value, row[metric]["p50"] * 1000), fontsize="x-small",
                                  textcoords="offset points", xytext=(3, 3))
    if not drawn:
        plt.close(figure)
        return "no plot: no level produced output"
    for axis, title in zip(axes, ("time to first token", "inter-token latency"), strict=True):
        axis.set_title(title)
        axis.set_xlabel("output tokens/s")
        axis.set_ylabel("ms")
        axis.set_yscale("log")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return None
