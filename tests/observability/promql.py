"""Reading metric names out of PromQL and out of a /metrics exposition, for checks against a live server."""

from __future__ import annotations

import re

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
             "group_right", "inf", "nan", "atan2"}
# Grafana's template variables, replaced the way Grafana would before the query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m", "$model": ".*"}


def grafana_to_promql(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (strings, label matchers, ranges, grouping labels and
    function names removed)."""
    expr = _STRING.sub('""', expr)
    expr = _MATCHERS.sub("", expr)
    expr = _RANGE.sub("", expr)
    expr = _GROUPING.sub("", expr)
    names = set()
    for match in _IDENTIFIER.finditer(expr):
        before = expr[match.start() - 1] if match.start() else " "
        after = expr[match.end():].lstrip()[:1]
        if before.isdigit() or before == ".":  # part of a number such as 1e9, or a duration such as 5m
            continue
        if after != "(" and match.group() not in _KEYWORDS:  # not a function or aggregation
            names.add(match.group())
    return names


def exposed_families(exposition: str) -> dict[str, str]:
    """Every metric family a /metrics text declares (`# TYPE name type`), samples or not: name -> type."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", exposition, flags=re.MULTILINE))


def selectable_names(families: dict[str, str]) -> set[str]:
    """The series names a query can select from those families: histograms as _bucket, _sum and _count."""
    names = set()
    for name, kind in families.items():
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        elif kind == "summary":
            names |= {name, f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    return names


def sampled_names(exposition: str) -> set[str]:
    """The series names that have at least one sample in a /metrics text."""
    return set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", exposition, flags=re.MULTILINE))
