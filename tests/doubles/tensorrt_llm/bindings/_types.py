"""Argument checking for the test double of TensorRT-LLM's bindings: what nanobind enforces on the real ones.

Wrong types raise TypeError (nanobind's "incompatible function arguments"); values the C++ side rejects raise
RuntimeError (TensorRT-LLM's checks surface as RuntimeError in Python); read-only properties raise
AttributeError when set.
"""

from __future__ import annotations


def _fits(value, kind) -> bool:
    if kind is object:
        return True
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is bool:
        return isinstance(value, bool)
    return isinstance(value, kind)


def check(name: str, value, kind, *, optional: bool = False, items=None, minimum=None, maximum=None):
    """`value` if it is a `kind` (None allowed when optional); float arguments accept ints, as nanobind does."""
    if value is None:
        if optional:
            return None
        raise TypeError(f"incompatible function arguments: '{name}' must be {kind.__name__}, not None")
    if not _fits(value, kind):
        raise TypeError(f"incompatible function arguments: '{name}' must be {kind.__name__}, "
                        f"not {type(value).__name__}")
    if items is not None and any(not _fits(item, items) for item in value):
        raise TypeError(f"incompatible function arguments: '{name}' must hold only {items.__name__} values")
    if minimum is not None and value < minimum:
        raise RuntimeError(f"{name} must be at least {minimum} (got {value})")
    if maximum is not None and value > maximum:
        raise RuntimeError(f"{name} must be at most {maximum} (got {value})")
    return float(value) if kind is float else value


class Field:
    """A typed property stored in the slot `_<name>`; read-only ones are set by the constructor only."""

    def __init__(self, kind, *, optional=False, readonly=False, items=None, minimum=None, maximum=None):
        self.kind, self.optional, self.readonly = kind, optional, readonly
        self.items, self.minimum, self.maximum = items, minimum, maximum

    def __set_name__(self, owner, name):
        self.name, self.slot = name, f"_{name}"

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        return getattr(obj, self.slot)

    def __set__(self, obj, value):
        if self.readonly:
            raise AttributeError(f"property '{self.name}' of '{type(obj).__name__}' object has no setter")
        object.__setattr__(obj, self.slot, self._check(value))

    def _check(self, value):
        return check(self.name, value, self.kind, optional=self.optional, items=self.items,
                     minimum=self.minimum, maximum=self.maximum)

    @staticmethod
    def init(obj, **values) -> None:
        """Constructor arguments into their fields, checked."""
        for name, value in values.items():
            field = getattr(type(obj), name)
            object.__setattr__(obj, field.slot, field._check(value))


def bind_overload(name: str, args: tuple, kwargs: dict, *overloads) -> tuple[int, dict]:
    """nanobind's overload resolution: the first signature that takes these arguments, else TypeError.

    Each overload is a list of (parameter, type) or (parameter, type, default)."""
    for index, params in enumerate(overloads):
        values = _bind(params, args, kwargs)
        if values is not None:
            return index, values
    shown = " | ".join("(" + ", ".join(p[0] for p in params) + ")" for params in overloads)
    raise TypeError(f"{name}(): incompatible function arguments; supported signatures: {shown}")


def _bind(params, args, kwargs) -> dict | None:
    names = [param[0] for param in params]
    if len(args) > len(params) or any(key not in names for key in kwargs):
        return None
    values = {}
    for position, (pname, kind, *default) in enumerate(params):
        if position < len(args):
            if pname in kwargs:
                return None
            value = args[position]
        elif pname in kwargs:
            value = kwargs[pname]
        elif default:
            value = default[0]
        else:
            return None
        if value is None and default and default[0] is None:
            values[pname] = None
        elif _fits(value, kind):
            values[pname] = value
        else:
            return None
    return values
