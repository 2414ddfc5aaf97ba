"""What the reference on TensorRT-LLM 1.2 (../shared/reference/tensorrt-llm-1.2.md) says the Executor's Python
bindings are made of: the names in its §1 and §8 (corrections and additions, checked against 1.2 sources), and
the argument rules it spells out for a few classes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Reference:
    names: frozenset[str]  # every name §1 lists, and §8's corrections and additions
    kv_cache_positional: tuple[str, ...]  # KvCacheConfig's positional-or-keyword arguments, in order
    kv_cache_keyword_only: frozenset[str]
    request_positional: tuple[str, ...]
    sampling_positional: tuple[str, ...]


def read_reference(path: Path) -> Reference:
    text = path.read_text()
    section = text[text.index("## 1.") : text.index("## 2.")]
    additions = text[text.index("## 8.") :]
    return Reference(
        names=frozenset(_names(section) | _names(additions)),
        kv_cache_positional=tuple(_backticked_names(_paragraph(section, "**Positional or keyword, in order:**"))),
        kv_cache_keyword_only=frozenset(_backticked_names(_paragraph(section, "**Keyword-only:**"))),
        request_positional=tuple(_backticked_names(_paragraph(section, "**Positional:**"))),
        sampling_positional=tuple(_backticked_names(_paragraph(section, "**SamplingConfig:**").split(";")[0])),
    )


def _names(section: str) -> set[str]:
    names: set[str] = set()
    for span in re.findall(r"`([^`]+)`", section):  # names in code spans: classes, arguments, methods
        names |= set(_IDENTIFIER.findall(_expand(span)))
    for line in section.splitlines():
        if line.startswith("|"):  # tables list fields as plain, comma-separated names
            names |= {name for cell in line.split("|") for name in _listed(cell)}
        elif line.startswith("### "):  # headings name classes: "### Response / Result / FinishReason [NB-REQ]"
            title = line[4:].split("[")[0]
            names |= {part.strip() for part in title.split("/") if _IDENTIFIER.fullmatch(part.strip())}
    names |= set(re.findall(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b|\b[A-Z]{3,}\b", section))  # enum members
    # An enum type is named after the argument it is the value of (model_type: ModelType,
    # capacity_scheduler_policy: CapacitySchedulerPolicy), so `communication_mode=LEADER` names CommunicationMode.
    for argument in re.findall(r"\b([a-z][a-z0-9_]*)=[A-Z][A-Z0-9_]*\b", section):
        names.add("".join(part.capitalize() for part in argument.split("_")))
    return names


def _listed(cell: str) -> list[str]:
    """The names in a table cell that is a list of names ("max_num_blocks, **tokens_per_block**, cache_hit_rate =
    reused/(reused+missed)"); none from a cell of prose, whose comma-separated items are not single names."""
    items = [item.split(" = ")[0].replace("*", "").strip() for item in re.split(r"[,;]", _expand(cell))]
    items = [re.sub(r"\s*\(.*\)$", "", item) for item in items]  # "timestamp (str)", "RequestStats (in ...)"
    return [item for item in items if _IDENTIFIER.fullmatch(item)]


def _expand(text: str) -> str:
    """The reference's shorthands spelled out: gpu/cpu/pinned_mem_usage, {alloc_total, reused}_blocks."""
    text = re.sub(r"\b((?:[a-z]+/)+[a-z]+)(_[a-z_]+)",
                  lambda m: ", ".join(p + m.group(2) for p in m.group(1).split("/")), text)
    return re.sub(r"\{([^}]*)\}(_[a-z_]+)",
                  lambda m: ", ".join(p.strip() + m.group(2) for p in m.group(1).split(",")), text)


def _paragraph(section: str, marker: str) -> str:
    start = section.index(marker) + len(marker)
    ends = [i for i in (section.find("\n- ", start), section.find("\n\n", start)) if i >= 0]
    return section[start : min(ends)]


def _backticked_names(text: str) -> list[str]:
    return [_IDENTIFIER.match(span).group(0) for span in re.findall(r"`([^`]+)`", text)]
