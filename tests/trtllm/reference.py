"""What the project's TensorRT-LLM 1.2 facts table (tensorrt_llm_1_2_facts.toml, beside this file) says the
Executor's Python bindings are made of: every name, the argument rules of a few classes, and the behaviours
with their sources."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

FACTS = Path(__file__).with_name("tensorrt_llm_1_2_facts.toml")
# The keys of a [bindings.<Class>] table that list names the bindings have.
NAME_KEYS = (
    "positional", "positional_or_keyword", "keyword_only", "keyword", "required", "other_constructor_arguments",
    "properties", "read_only", "methods", "method_arguments", "members", "nested_properties", "values",
)
OTHER_KEYS = ("sources", "accepts_unknown_attributes", "not_bound")


@dataclass(frozen=True)
class Fact:
    topic: str
    fact: str
    sources: tuple[str, ...]
    correction: bool
    confirmed: bool


@dataclass(frozen=True)
class Reference:
    names: frozenset[str]  # every class, member, argument and method the table lists
    kv_cache_positional: tuple[str, ...]  # KvCacheConfig's positional-or-keyword arguments, in order
    kv_cache_keyword_only: frozenset[str]
    request_positional: tuple[str, ...]
    sampling_positional: tuple[str, ...]
    sources: frozenset[str]  # the source keys defined
    cited: dict[str, tuple[str, ...]]  # each class's and fact's sources, by class name or "fact: topic"
    facts: tuple[Fact, ...]


class FactsError(ValueError):
    """The table does not have the shape this reader expects."""


def read_reference(path: Path = FACTS) -> Reference:
    """Read the table; raises FileNotFoundError if it is missing and FactsError if it is malformed."""
    data = tomllib.loads(path.read_text())
    bindings: dict[str, dict] = data["bindings"]
    names: set[str] = set()
    cited: dict[str, tuple[str, ...]] = {}
    for cls, entry in bindings.items():
        unknown = set(entry) - set(NAME_KEYS) - set(OTHER_KEYS)
        if unknown:
            raise FactsError(f"[bindings.{cls}] has keys this reader does not know: {sorted(unknown)}")
        names.add(cls)
        for key in NAME_KEYS:
            names.update(entry.get(key, ()))
        cited[cls] = tuple(entry.get("sources", ()))
    facts = tuple(
        Fact(f["topic"], f["fact"], tuple(f["sources"]), f.get("correction", False), f.get("confirmed", True))
        for f in data["facts"]
    )
    cited.update({f"fact: {fact.topic}: {fact.fact[:40]}": fact.sources for fact in facts})
    return Reference(
        names=frozenset(names),
        kv_cache_positional=tuple(bindings["KvCacheConfig"]["positional_or_keyword"]),
        kv_cache_keyword_only=frozenset(bindings["KvCacheConfig"]["keyword_only"]),
        request_positional=tuple(bindings["Request"]["positional"]),
        sampling_positional=tuple(bindings["SamplingConfig"]["positional"]),
        sources=frozenset(data["sources"]),
        cited=cited,
        facts=facts,
    )


@dataclass(frozen=True)
class Tool:
    sources: tuple[str, ...]
    flags: frozenset[str]
    values: dict[str, tuple[str, ...]]  # by flag, where the values were read
    deprecated: frozenset[str]


@dataclass(frozen=True)
class BuildTools:
    tools: dict[str, Tool]  # by tool: convert_checkpoint.py, quantize.py, trtllm-build
    sources: frozenset[str]

    @property
    def values(self) -> frozenset[str]:
        """Every value read for any flag of any tool."""
        return frozenset(v for tool in self.tools.values() for values in tool.values.values() for v in values)


def read_build_tools(path: Path = FACTS) -> BuildTools:
    """The table's [tools]: the ahead-of-time build's command-line flags; raises FileNotFoundError if missing."""
    data = tomllib.loads(path.read_text())
    tools = {
        name: Tool(
            sources=tuple(entry["sources"]),
            flags=frozenset(entry["flags"]),
            values={flag: tuple(values) for flag, values in entry.get("values", {}).items()},
            deprecated=frozenset(entry.get("deprecated", ())),
        )
        for name, entry in data["tools"].items()
    }
    return BuildTools(tools, frozenset(data["sources"]))
