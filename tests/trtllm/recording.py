"""A recording proxy of a module: every attribute read or written and every keyword passed, through any
object the module hands out (configs, the executor, responses, stats), lands in `Recorder.names`.

The conformance test wraps the test double of TensorRT-LLM's bindings in it and drives the real adapter
through it, so the names the adapter uses are observed, not guessed from its source.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import PurePath

_PLAIN = (str, bytes, int, float, bool, type(None), timedelta, PurePath)


class Recorder:
    def __init__(self):
        self.names: set[str] = set()
        self._lock = threading.Lock()

    def note(self, *names: str) -> None:
        with self._lock:
            self.names.update(names)

    def wrap(self, value):
        if isinstance(value, (*_PLAIN, _Proxy)):
            return value
        if isinstance(value, list | tuple):
            return type(value)(self.wrap(item) for item in value)
        if isinstance(value, dict):
            return {key: self.wrap(item) for key, item in value.items()}
        return _Proxy(value, self)


def unwrap(value):
    if isinstance(value, _Proxy):
        return object.__getattribute__(value, "_target")
    if isinstance(value, list | tuple):
        return type(value)(unwrap(item) for item in value)
    if isinstance(value, dict):
        return {key: unwrap(item) for key, item in value.items()}
    return value


class _Proxy:
    __slots__ = ("_recorder", "_target")

    def __init__(self, target, recorder: Recorder):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_recorder", recorder)

    def __getattr__(self, name: str):
        self._recorder.note(name)
        return self._recorder.wrap(getattr(self._target, name))

    def __setattr__(self, name: str, value) -> None:
        self._recorder.note(name)
        setattr(self._target, name, unwrap(value))

    def __call__(self, *args, **kwargs):
        self._recorder.note(*kwargs)
        return self._recorder.wrap(self._target(*unwrap(args), **unwrap(kwargs)))

    def __eq__(self, other) -> bool:
        return self._target == unwrap(other)

    def __hash__(self) -> int:
        return hash(self._target)

    def __repr__(self) -> str:
        return f"<recorded {self._target!r}>"
