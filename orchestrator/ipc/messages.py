"""Every message that crosses between the HTTP process and a model's worker process, and its wire form.

ipc/channel.py frames them (length-prefixed JSON objects); this module says what each frame holds. Every frame is
a JSON object whose "kind" names its message; each message is a frozen dataclass whose `to_wire()` makes its frame
and whose `from_wire(frame)` reads one back, raising `MalformedFrame` (naming the kind, the field and the value)
for a frame that is not exactly that message: a missing or unknown field, or a value of the wrong type.

    kind      direction          message       fields
    idle      worker -> server   Idle          pid                      a fresh worker, its runtimes imported
    load      server -> worker   LoadSpec      engine_dir, kv_cache_bytes, backend, options, weights_kept
    ready     worker -> server   WorkerReady   pid, rss_bytes, load (LoadReport's fields)
    failed    worker -> server   LoadFailed    error (errors.to_wire)   the load failed; the worker exits
    submit    server -> worker   Submit        request (EngineRequest.to_wire), attach (ipc/handoff.py)
    cancel    server -> worker   Cancel        id, error (errors.to_wire: end it with that error)
    stats     server -> worker   StatsQuery    seq
    stats     worker -> server   StatsReport   seq, stats (BackendStats' fields)
    step      worker -> server   Step          outputs: one TextDelta row per request with news
    shutdown  server -> worker   Shutdown      (none)                   finish and exit

A worker greets with "idle", gets one "load" and answers "ready" or "failed"; after "ready" the server sends
submit, cancel, stats and shutdown, and the worker sends step and stats. `decode_to_worker` and
`decode_from_worker` read a frame of either direction into its message.
"""

from __future__ import annotations

import functools
import typing
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import ClassVar

from orchestrator.backends.options import BackendOptions, parse_options
from orchestrator.backends.protocol import BackendStats, LoadReport
from orchestrator.engine.request import EngineRequest, FinishReason
from orchestrator.errors import InfernoError, from_wire, to_wire


class MalformedFrame(ValueError):
    """A frame that is not the message its kind names. `request_id` is the request a "submit" frame carried,
    when it can be read, so that request alone can be failed."""

    def __init__(self, message: str, request_id: str | None = None):
        super().__init__(message)
        self.request_id = request_id


class FrameKind(StrEnum):
    IDLE = "idle"
    LOAD = "load"
    READY = "ready"
    FAILED = "failed"
    SUBMIT = "submit"
    CANCEL = "cancel"
    STATS = "stats"
    STEP = "step"
    SHUTDOWN = "shutdown"
    RELEASE = "release"


# -- reading fields ------------------------------------------------------------------------------------------------
def _is(value: object, expected: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # JSON's true is not a number
        return bool in expected
    return isinstance(value, expected) or (isinstance(value, int) and float in expected)


def _checked(data: object, kind: str, expected: dict[str, tuple[type, ...]], where: str = "frame") -> dict:
    """`data` as a dict holding exactly the fields in `expected` (a field whose types include None may be left
    out), each of one of its types."""
    if not isinstance(data, dict):
        raise MalformedFrame(f"a '{kind}' {where} must be a JSON object (got {data!r:.80})")
    unknown = data.keys() - expected.keys() - ({"kind"} if where == "frame" else set())
    if unknown:
        raise MalformedFrame(f"a '{kind}' {where} has unknown field(s) {', '.join(sorted(unknown))}")
    for name, types in expected.items():
        if name not in data:
            if type(None) in types:
                continue
            raise MalformedFrame(f"a '{kind}' {where} needs '{name}'")
        if not _is(data[name], types):
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise MalformedFrame(f"a '{kind}' {where}'s '{name}' must be {wanted} (got {data[name]!r:.80})")
    return data


@functools.cache
def _field_types(cls: type) -> dict[str, tuple[type, ...]]:
    """A dataclass's fields and the types each may hold on the wire (int | None -> (int, NoneType))."""
    hints = typing.get_type_hints(cls)
    return {f.name: typing.get_args(hints[f.name]) or (hints[f.name],) for f in fields(cls)}


def _framed(kind: FrameKind, frame: object) -> None:
    if not isinstance(frame, dict) or frame.get("kind") != kind:
        raise MalformedFrame(f"expected a '{kind}' frame (got {frame!r:.80})")


# -- the load --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Idle:
    """A fresh worker's greeting, once its runtimes are imported: it waits for a load."""

    KIND: ClassVar[FrameKind] = FrameKind.IDLE
    pid: int

    def to_wire(self) -> dict:
        return {"kind": self.KIND, "pid": self.pid}

    @classmethod
    def from_wire(cls, frame: dict) -> Idle:
        _framed(cls.KIND, frame)
        return cls(_checked(frame, cls.KIND, {"pid": (int,)})["pid"])


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """What to load: the engine folder, the KV cache budget the memory ledger assigned, the option section of the
    engine's backend (backends/options.py; on the wire the section's backend and fields), and whether the server
    kept the model's weights in host RAM since its last unload (placement knows; a sim engine loads faster then).
    A frame without `weights_kept` means False."""

    KIND: ClassVar[FrameKind] = FrameKind.LOAD
    engine_dir: str
    kv_cache_bytes: int
    options: BackendOptions
    weights_kept: bool = False

    def to_wire(self) -> dict:
        return {"kind": self.KIND, "engine_dir": self.engine_dir, "kv_cache_bytes": self.kv_cache_bytes,
                "backend": self.options.backend, "options": self.options.model_dump(),
                "weights_kept": self.weights_kept}

    @classmethod
    def from_wire(cls, frame: dict) -> LoadSpec:
        _framed(cls.KIND, frame)
        expected = {"engine_dir": (str,), "kv_cache_bytes": (int,), "backend": (str,), "options": (dict,),
                    "weights_kept": (bool, type(None))}
        data = _checked(frame, cls.KIND, expected)
        try:
            options = parse_options(data["backend"], data["options"])
        except InfernoError as exc:
            raise MalformedFrame(f"a 'load' frame's options: {exc.message}") from None
        return cls(data["engine_dir"], data["kv_cache_bytes"], options, bool(data.get("weights_kept")))


@dataclass(frozen=True, slots=True)
class WorkerReady:
    """A worker's report once its engine has loaded: its process, its resident memory, its backend's report."""

    KIND: ClassVar[FrameKind] = FrameKind.READY
    pid: int
    rss_bytes: int
    load: LoadReport

    def to_wire(self) -> dict:
        return {"kind": self.KIND, "pid": self.pid, "rss_bytes": self.rss_bytes, "load": asdict(self.load)}

    @classmethod
    def from_wire(cls, frame: dict) -> WorkerReady:
        _framed(cls.KIND, frame)
        data = _checked(frame, cls.KIND, {"pid": (int,), "rss_bytes": (int,), "load": (dict,)})
        load = _checked(data["load"], FrameKind.READY, _field_types(LoadReport), where="frame's load")
        return cls(data["pid"], data["rss_bytes"], LoadReport(**load))


@dataclass(frozen=True)
class LoadFailed:
    """The load failed with `error` (crossing by class name, errors.to_wire); the worker exits after it."""

    KIND: ClassVar[FrameKind] = FrameKind.FAILED
    error: InfernoError

    def to_wire(self) -> dict:
        return {"kind": self.KIND, "error": to_wire(self.error)}

    @classmethod
    def from_wire(cls, frame: dict) -> LoadFailed:
        _framed(cls.KIND, frame)
        error = _checked(frame, cls.KIND, {"error": (dict,)})["error"]
        _checked(error, cls.KIND, {"kind": (str,), "message": (str,), "param": (str, type(None)),
                                   "retry_after_s": (float, type(None))}, where="frame's error")
        return cls(from_wire(error))


# -- requests ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Submit:
    """Start an engine request (one choice). With `attach`, the client's socket came over the handoff
    (ipc/handoff.py) just before this frame, with the bytes the worker writes it (worker/direct.py): the response's
    head (its headers and first events, written with the first text), and the bytes before and after a chunk's text
    as JSON (an event of its stream); each as latin-1 text, a character a byte."""

    KIND: ClassVar[FrameKind] = FrameKind.SUBMIT
    request: EngineRequest
    attach: tuple[str, str, str] | None = None

    def to_wire(self) -> dict:
        wire = {"kind": self.KIND, "request": self.request.to_wire()}
        return wire if self.attach is None else wire | {"attach": list(self.attach)}

    @classmethod
    def from_wire(cls, frame: dict) -> Submit:
        _framed(cls.KIND, frame)
        checked = _checked(frame, cls.KIND, {"request": (dict,), "attach": (list, type(None))})
        wire, attach = checked["request"], checked.get("attach")
        request_id = wire.get("id")
        if not isinstance(request_id, str):
            raise MalformedFrame(f"a 'submit' frame's request needs a string 'id' (got {request_id!r:.80})")
        if attach is not None and not (len(attach) == 3 and all(type(part) is str for part in attach)):
            raise MalformedFrame(f"a 'submit' frame's attach is [head, prefix, suffix] (got {attach!r:.80})",
                                 request_id)
        try:
            return cls(EngineRequest.from_wire(wire), None if attach is None else tuple(attach))
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedFrame(f"a 'submit' frame's request is malformed: {exc!r}", request_id) from None


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop an engine request; its final row says CANCELLED (unknown or finished ids are ignored). With `error`
    (errors.to_wire), the worker ends the request with that error at once instead: its final row is the failure,
    sent after whatever the worker wrote to the client itself (an attached stream's server cannot know what)."""

    KIND: ClassVar[FrameKind] = FrameKind.CANCEL
    request_id: str
    error: dict | None = None

    def to_wire(self) -> dict:
        wire = {"kind": self.KIND, "id": self.request_id}
        return wire if self.error is None else wire | {"error": self.error}

    @classmethod
    def from_wire(cls, frame: dict) -> Cancel:
        _framed(cls.KIND, frame)
        checked = _checked(frame, cls.KIND, {"id": (str,), "error": (dict, type(None))})
        return cls(checked["id"], checked.get("error"))


class _Signal:
    """A message that is only its kind."""

    __slots__ = ()
    KIND: ClassVar[FrameKind]

    def to_wire(self) -> dict:
        return {"kind": self.KIND}

    @classmethod
    def from_wire(cls, frame: dict):
        _framed(cls.KIND, frame)
        _checked(frame, cls.KIND, {})
        return cls()


@dataclass(frozen=True, slots=True)
class Shutdown(_Signal):
    """Stop serving and exit (the engine is closed first)."""

    KIND: ClassVar[FrameKind] = FrameKind.SHUTDOWN


@dataclass(frozen=True, slots=True)
class Release(_Signal):
    """Close the engine and wait for another load: the worker becomes a spare again. It answers "idle" once
    its engine's memory is back, or exits (as for a shutdown) when its backend cannot give all of it back."""

    KIND: ClassVar[FrameKind] = FrameKind.RELEASE


# -- engine stats ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StatsQuery:
    """Ask for the engine's stats; the answer carries the same `seq`."""

    KIND: ClassVar[FrameKind] = FrameKind.STATS
    seq: int

    def to_wire(self) -> dict:
        return {"kind": self.KIND, "seq": self.seq}

    @classmethod
    def from_wire(cls, frame: dict) -> StatsQuery:
        _framed(cls.KIND, frame)
        return cls(_checked(frame, cls.KIND, {"seq": (int,)})["seq"])


@dataclass(frozen=True, slots=True)
class StatsReport:
    """The answer to the StatsQuery with the same `seq`."""

    KIND: ClassVar[FrameKind] = FrameKind.STATS
    seq: int
    stats: BackendStats

    def to_wire(self) -> dict:
        return {"kind": self.KIND, "seq": self.seq, "stats": asdict(self.stats)}

    @classmethod
    def from_wire(cls, frame: dict) -> StatsReport:
        _framed(cls.KIND, frame)
        data = _checked(frame, cls.KIND, {"seq": (int,), "stats": (dict,)})
        stats = _checked(data["stats"], cls.KIND, _field_types(BackendStats), where="frame's stats")
        return cls(data["seq"], BackendStats(**stats))


# -- output --------------------------------------------------------------------------------------------------------
# A step row's fields, by position: `[request_id, text, num_tokens, finish, error]`, plus a sixth element of extras
# when any is set. The readers on the hot path (the worker client's dispatch, a request's fast path) index rows
# by these names instead of turning each into a TextDelta.
ROW_REQUEST_ID, ROW_TEXT, ROW_NUM_TOKENS, ROW_FINISH, ROW_ERROR = range(5)
PLAIN_ROW_LEN = 5  # a row without extras


@dataclass(slots=True)
class TextDelta:
    """What the worker sends back per request per engine step: new text, ready to stream.

    On the wire a row is `[request_id, text, num_tokens, finish, error]`, plus a sixth element, a dict of the
    extras below that are set, only when one is."""

    request_id: str
    text: str
    num_tokens: int  # tokens this delta accounts for (text may lag tokens across a split character)
    finish: FinishReason | None = None
    error: dict | None = None  # errors.to_wire() of the failure, with finish=ERROR
    logprobs: list | None = None  # per token: [token text, log probability, top alternatives], when asked
    cached_tokens: int | None = None  # prompt tokens the engine served from its prefix cache
    reasoning: str | None = None  # new thinking text (reasoning models), apart from the answer's text
    tool_calls: list | None = None  # OpenAI's delta.tool_calls entries: id, type and name once, then arguments
    # An attached stream handed back after its worker wrote to the client (worker/direct.py): the bytes it could
    # not write (as latin-1; "" where all went), for the server to write first, and when its first token came.
    tail: str | None = None
    first_token: float | None = None  # time.monotonic(), the same clock in every process of the machine

    @classmethod
    def failure(cls, request_id: str, error: InfernoError) -> TextDelta:
        """The last delta of a request that failed with `error`."""
        return cls(request_id, "", 0, FinishReason.ERROR, to_wire(error))

    def to_wire(self) -> list:
        row = [self.request_id, self.text, self.num_tokens, self.finish and self.finish.value, self.error]
        extras = {name: value for name in _EXTRAS if (value := getattr(self, name)) is not None}
        return [*row, extras] if extras else row

    @classmethod
    def from_wire(cls, row: list) -> TextDelta:
        """The delta of a row; MalformedFrame if the row is not one (`Step` checks only the request id)."""
        if not isinstance(row, list) or len(row) not in (PLAIN_ROW_LEN, PLAIN_ROW_LEN + 1):
            raise MalformedFrame(f"a 'step' row must be a list of 5 or 6 items (got {row!r:.80})")
        rid, text, num_tokens, finish, error, *rest = row
        if not (isinstance(rid, str) and isinstance(text, str) and _is(num_tokens, (int,))
                and _is(error, (dict, type(None)))):
            raise MalformedFrame(f"a 'step' row must be [id, text, tokens, finish, error(, extras)] (got {row!r:.80})")
        try:
            delta = cls(rid, text, num_tokens, FinishReason(finish) if finish is not None else None, error)
        except ValueError:
            raise MalformedFrame(f"a 'step' row's finish must be a finish reason (got {finish!r:.80})") from None
        if rest:
            for name, value in _checked(rest[0], FrameKind.STEP, _EXTRA_TYPES, where="row's extras").items():
                setattr(delta, name, value)
        return delta


_EXTRAS = ("logprobs", "cached_tokens", "reasoning", "tool_calls", "tail", "first_token")
_EXTRA_TYPES = {name: types for name, types in _field_types(TextDelta).items() if name in _EXTRAS}


@dataclass(frozen=True, slots=True)
class Step:
    """Everything one engine step produced: one row (TextDelta.to_wire) per request that has news.

    Rows stay wire rows: the HTTP process hands each to its request as it came (a plain text row takes the fast
    path without becoming a TextDelta), so `from_wire` checks only that each row is a list led by a request id;
    the rest of a row is checked where it is read (`TextDelta.from_wire`)."""

    KIND: ClassVar[FrameKind] = FrameKind.STEP
    rows: list = field(default_factory=list)

    def to_wire(self) -> dict:
        return {"kind": self.KIND, "outputs": self.rows}

    @classmethod
    def from_wire(cls, frame: dict) -> Step:
        _framed(cls.KIND, frame)
        rows = frame.get("outputs")
        if len(frame) != 2 or type(rows) is not list:
            raise MalformedFrame(f"a 'step' frame is {{kind, outputs: [row, ...]}} (got {frame!r:.80})")
        for row in rows:
            if type(row) is not list or len(row) < PLAIN_ROW_LEN or type(row[ROW_REQUEST_ID]) is not str:
                raise MalformedFrame(f"a 'step' row must be a list led by a request id (got {row!r:.80})")
        return cls(rows)


# -- the tables --------------------------------------------------------------------------------------------------
ToWorker = LoadSpec | Submit | Cancel | StatsQuery | Shutdown | Release
FromWorker = Idle | WorkerReady | LoadFailed | StatsReport | Step

TO_WORKER: dict[FrameKind, type[ToWorker]] = {
    m.KIND: m for m in (LoadSpec, Submit, Cancel, StatsQuery, Shutdown, Release)
}
FROM_WORKER: dict[FrameKind, type[FromWorker]] = {
    m.KIND: m for m in (Idle, WorkerReady, LoadFailed, StatsReport, Step)
}


def _decode(frame: object, table: dict, direction: str):
    kind = frame.get("kind") if isinstance(frame, dict) else None
    message = table.get(kind) if isinstance(kind, str) else None
    if message is None:
        raise MalformedFrame(f"no '{kind}' frame goes {direction} (got {frame!r:.80})")
    return message.from_wire(frame)


def decode_to_worker(frame: object) -> ToWorker:
    """A frame the server sent, as its message; MalformedFrame for anything else."""
    return _decode(frame, TO_WORKER, "to a worker")


def decode_from_worker(frame: object) -> FromWorker:
    """A frame a worker sent, as its message; MalformedFrame for anything else."""
    return _decode(frame, FROM_WORKER, "from a worker")
