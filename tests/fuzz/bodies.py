"""Request bodies generated from a JSON Schema (the server's own /openapi.json), deterministically from a seed.

Half follow the schema, with numbers drawn towards their bounds and beyond what a backend's internals hold
(int32, int64, doubles); half are mutations of a valid body: one field replaced by a hostile value (a wrong
type, an integer past 2**64, NaN or Infinity, a huge or odd string, deep nesting, an unknown key). The point
is not realism but coverage of every field with the values that break servers.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

HOSTILE_NUMBERS = (0, -1, 1, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63) - 1, -(2**31),
                   0.5, -0.0, 1e-300, 1e300, math.inf, -math.inf, math.nan)
HOSTILE_STRINGS = ("", " ", "\x00", "\ud83d", "😀" * 50, "a" * 1500, "<|im_end|>", "{{ raise }}", "%s%n",
                   "\n" * 100, "null", "-1")


class BodyGenerator:
    def __init__(self, document: dict, seed: int):
        self._schemas = document["components"]["schemas"]
        self.rng = random.Random(seed)

    # -- values that follow a schema -------------------------------------------------------------------------
    def value(self, schema: dict, depth: int = 0) -> Any:
        schema = self._resolve(schema)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return self.rng.choice(schema["enum"])
        if "anyOf" in schema or "oneOf" in schema:
            return self.value(self.rng.choice(schema.get("anyOf") or schema["oneOf"]), depth)
        kind = schema.get("type")
        if kind == "object" or "properties" in schema:
            return self._object(schema, depth)
        maker = {"array": self._array, "string": self._string, "integer": self._integer, "number": self._number,
                 "boolean": lambda s, d: self.rng.random() < 0.5, "null": lambda s, d: None}.get(kind)
        return maker(schema, depth) if maker else self.rng.choice([None, 1, "x", [], {}])

    def _resolve(self, schema: dict) -> dict:
        while "$ref" in schema:
            schema = self._schemas[schema["$ref"].rsplit("/", 1)[-1]]
        return schema

    def _object(self, schema: dict, depth: int) -> dict:
        properties, required = schema.get("properties", {}), set(schema.get("required", ()))
        if not properties:  # a free-form object (chat_template_kwargs, logit_bias): a few entries
            values = schema.get("additionalProperties")
            keys = [str(self.rng.choice([0, 1, 28, 49151, 49152, 2**31])) for _ in range(self.rng.randint(0, 3))]
            return {k: (self.value(values, depth + 1) if isinstance(values, dict) else k) for k in keys}
        body = {}
        for name, sub in properties.items():
            if name in required or (depth < 3 and self.rng.random() < 0.35):
                body[name] = self.value(sub, depth + 1)
        return body

    def _array(self, schema: dict, depth: int) -> list:
        low, high = schema.get("minItems", 0), min(schema.get("maxItems", 4), 4 if depth < 3 else 1)
        return [self.value(schema.get("items", {}), depth + 1) for _ in range(self.rng.randint(low, max(low, high)))]

    def _string(self, schema: dict, depth: int) -> str:
        if "pattern" in schema:  # the schemas' one pattern is a tool's or a format's name: a name that matches it
            return self.rng.choice(["get_weather", "a", "tool-1", "x" * 64])
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        text = self.rng.choice(["Hi", "Say hi", "The capital of France is", "", "日本語", "x" * 50, "\n"])
        text = text if len(text) >= low else text + "a" * low
        return text if high is None else text[:high]

    def _integer(self, schema: dict, depth: int) -> int:
        low, high = schema.get("minimum", -(2**63)), schema.get("maximum", 2**63 - 1)
        return self.rng.choice([low, high, low + 1, max(low, min(high, 0)), max(low, min(high, 3)),
                                self.rng.randint(low, min(high, low + 100))])

    def _number(self, schema: dict, depth: int) -> float:
        low = schema.get("minimum", schema.get("exclusiveMinimum", -1e9))
        high = schema.get("maximum", schema.get("exclusiveMaximum", 1e9))
        return self.rng.choice([low, high, (low + high) / 2, self.rng.uniform(low, high)])

    # -- hostile changes -----------------------------------------------------------------------------------------
    def mutate(self, body: dict, schema: dict) -> dict:
        properties = list(self._resolve(schema).get("properties", {}))
        target = dict(body)
        name = self.rng.choice([*properties, "unknown_field"])
        target[name] = self.hostile()
        return target

    def hostile(self, depth: int = 0) -> Any:
        pick = self.rng.randrange(6)
        if pick == 0:
            return self.rng.choice(HOSTILE_NUMBERS)
        if pick == 1:
            return self.rng.choice(HOSTILE_STRINGS)
        if pick == 2 and depth < 2:
            return [self.hostile(depth + 1) for _ in range(self.rng.randint(0, 3))]
        if pick == 3 and depth < 2:
            return {self.rng.choice(["role", "content", "type", "1", ""]): self.hostile(depth + 1)}
        if pick == 4:
            return self.rng.choice([None, True, False])
        nested: Any = 0
        for _ in range(self.rng.randint(50, 400)):
            nested = [nested]
        return nested

    def body(self, schema: dict) -> dict:
        valid = self.value(schema)
        return valid if self.rng.random() < 0.5 else self.mutate(valid, schema)


def encode(body: Any) -> bytes:
    """JSON as a careless client writes it: NaN and Infinity included."""
    return json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
