"""A structural tag rewritten as a plain EBNF grammar, for engines that take EBNF but not structural tags.

TensorRT-LLM's GuidedDecodingParams has a STRUCTURAL_TAG type, but whether the C++ guided decoder of a given
1.2 build compiles it is not settled (one revision read calls CompileStructuralTag, another refuses the type);
EBNF_GRAMMAR is compiled by every revision. xgrammar turns a structural tag into a grammar whose rules print
as EBNF it parses again; only the root needs renaming, because the printed root is `root_N` (the tag's JSON
schemas already use `root`) and EBNF grammars start at `root`. The grammar checker compiles this lowering
too, so a structural tag it admits is safe either way.

Imports xgrammar: the checker's process and workers only.
"""

from __future__ import annotations

import json
import re

import xgrammar as xgr

# Tokens of printed EBNF: string literals and character classes (skipped), identifiers, anything else.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[A-Za-z_][A-Za-z0-9_]*|.', re.DOTALL)


def structural_tag_as_ebnf(structural_tag: str) -> str:
    """The EBNF grammar (root rule `root`) equivalent to an xgrammar structural-tag JSON text."""
    grammar = xgr.Grammar.from_structural_tag(structural_tag)
    serialized = json.loads(grammar.serialize_json())
    names = {rule[0] for rule in serialized["rules"]}
    root = serialized["rules"][serialized["root_rule_id"]][0]
    text = str(grammar)
    if root == "root":
        return text
    spare = next(f"root_inner_{i}" for i in range(len(names) + 1) if f"root_inner_{i}" not in names)
    renames = {"root": spare, root: "root"}
    return "".join(renames.get(token, token) for token in _TOKENS.findall(text))
