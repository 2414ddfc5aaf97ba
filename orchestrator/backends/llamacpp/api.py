"""Every llama.cpp C call the server makes, in one thin module over llama-cpp-python's ctypes bindings.

llama.cpp renames C functions every few months (the `llama_kv_self_*` calls became `llama_memory_*`); when the
pinned binding moves, this file is the one to change. Nothing here decides anything: it loads a model, owns one
context and one batch, and exposes decode, logits, per-sequence KV edits and per-sequence state copies.

The bindings mirror llama.h's structs by hand, so they are used only with the libllama they bundle: the
`llama-cpp-python` version is pinned (pyproject.toml's `llamacpp` extra) and checked by `binding_version`.
llama.cpp aborts the process on some internal errors; it runs only inside a model's worker process.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

PINNED_BINDING = "0.3.36"  # llama-cpp-python, bundling llama.cpp 0c1e570
_LOG_WARN, _LOG_ERROR = 3, 4  # GGML_LOG_LEVEL_WARN, _ERROR (5, CONT, continues any level)
_state: dict = {}  # the imported bindings and the log callback, kept alive for the process


def bindings():
    """The llama_cpp module, imported and initialised once (llama.cpp's logs below warnings are dropped)."""
    if "lib" not in _state:
        import llama_cpp

        def forward(level: int, text: bytes, _user) -> None:
            if level in (_LOG_WARN, _LOG_ERROR) and text:
                log.warning("llama.cpp: %s", text.decode(errors="replace").rstrip())

        callback = llama_cpp.llama_log_callback(forward)
        llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _state.update(lib=llama_cpp, log_callback=callback)
    return _state["lib"]


def binding_version() -> str:
    import llama_cpp

    return llama_cpp.__version__


@dataclass(frozen=True)
class GgufFacts:
    """What llama.cpp reads from a GGUF file: the model's shape, size, template and end-of-generation tokens."""

    n_vocab: int
    n_layer: int
    n_head_kv: int
    n_embd: int
    n_head: int
    n_ctx_train: int
    n_params: int
    size_bytes: int
    description: str
    chat_template: str | None
    eog_tokens: tuple[int, ...]  # every token llama.cpp treats as end of generation


def _anonymous_mappings() -> set[tuple[int, ...]]:
    """This process's anonymous mappings (no file, no name), as (start, end) addresses."""
    with open("/proc/self/maps") as maps:
        return {tuple(int(at, 16) for at in line.split()[0].split("-")) for line in maps if len(line.split()) == 5}


class Model:
    """A loaded GGUF model. Its weights are read into memory of the process's own, not mapped from the file, and
    that memory is asked for 2 MiB pages (`madvise(MADV_HUGEPAGE)`, which the kernel grants unless transparent huge
    pages are off): a decode reads every weight, and the page cache maps a file in 4 KiB pages, so each 4 KiB of
    weights was a TLB miss per pass (single-token decodes 10-12% slower on the embedded default)."""

    def __init__(self, path: Path, vocab_only: bool = False, mapped: bool = False):
        """`mapped`: map the file instead, for a load that reads few of its weights (the build's check)."""
        lib = bindings()
        params = lib.llama_model_default_params()
        params.vocab_only = vocab_only
        params.load_mode = lib.LLAMA_LOAD_MODE_MMAP if mapped else lib.LLAMA_LOAD_MODE_NONE
        # llama.cpp calls `first_read` before it reads each tensor into its buffer. At the first call every buffer is
        # allocated and none written: the anonymous mappings made since `before` are the weights', and asked for huge
        # pages now, they are faulted in as 2 MiB pages while the file is read into them.
        before, libc = _anonymous_mappings(), ctypes.CDLL(None)

        def first_read(_progress: float, _user) -> bool:
            if before:  # the first call
                for start, end in _anonymous_mappings() - before:
                    libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), mmap.MADV_HUGEPAGE)
                before.clear()
            return True

        params.progress_callback = lib.llama_progress_callback(first_read)  # kept alive by params
        self._lib = lib
        self.handle = lib.llama_model_load_from_file(str(path).encode(), params)
        if not self.handle:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = lib.llama_model_get_vocab(self.handle)

    def facts(self) -> GgufFacts:
        lib, model, vocab = self._lib, self.handle, self.vocab
        n_vocab = lib.llama_vocab_n_tokens(vocab)
        description = ctypes.create_string_buffer(256)
        lib.llama_model_desc(model, description, len(description))
        template = lib.llama_model_chat_template(model, None)
        return GgufFacts(n_vocab=n_vocab, n_layer=lib.llama_model_n_layer(model),
                         n_head_kv=lib.llama_model_n_head_kv(model), n_embd=lib.llama_model_n_embd(model),
                         n_head=lib.llama_model_n_head(model), n_ctx_train=lib.llama_model_n_ctx_train(model),
                         n_params=lib.llama_model_n_params(model), size_bytes=lib.llama_model_size(model),
                         description=description.value.decode(errors="replace"),
                         chat_template=template.decode() if template else None,
                         eog_tokens=tuple(t for t in range(n_vocab) if lib.llama_vocab_is_eog(vocab, t)))

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        """llama.cpp's own tokenisation (Inferno tokenises with tokenizer.json; this is for checking they agree)."""
        data = text.encode()
        room = len(data) + 8
        tokens = (ctypes.c_int32 * room)()
        count = self._lib.llama_tokenize(self.vocab, data, len(data), tokens, room, False, special)
        if count < 0:
            raise RuntimeError(f"llama_tokenize needs {-count} tokens for {len(data)} bytes")
        return list(tokens[:count])

    def free(self) -> None:
        if self.handle:
            self._lib.llama_model_free(self.handle)
            self.handle = None


@dataclass(frozen=True)
class ContextShape:
    n_ctx: int  # KV cells in all
    n_batch: int  # tokens one llama_decode takes
    n_ubatch: int  # tokens one pass over the weights computes (llama.cpp splits a decode into such passes)
    n_seq_max: int  # sequence slots
    n_threads: int  # the threads a step runs on until `Context.set_threads` says otherwise
    # True: one pool of `n_ctx` cells that every sequence draws from. False: each sequence slot has a stream of
    # `n_ctx / n_seq_max` cells of its own (llama.cpp pads it to a multiple of 256).
    unified: bool = True


class Batch:
    """One llama_batch whose arrays are numpy arrays allocated once and written in bulk each step."""

    def __init__(self, capacity: int):
        lib = bindings()
        self.capacity = capacity
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.seq = np.zeros(capacity, dtype=np.int32)  # one sequence per token
        self.logits = np.zeros(capacity, dtype=np.int8)
        self._n_seq_id = np.ones(capacity, dtype=np.int32)
        seq_base = self.seq.ctypes.data
        self._seq_ptrs = (ctypes.POINTER(ctypes.c_int32) * capacity)(
            *(ctypes.cast(seq_base + 4 * i, ctypes.POINTER(ctypes.c_int32)) for i in range(capacity))
        )
        self.struct = lib.llama_batch()
        self.struct.token = self.token.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.embd = ctypes.POINTER(ctypes.c_float)()
        self.struct.pos = self.pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.n_seq_id = self._n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.seq_id = self._seq_ptrs
        self.struct.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.struct.n_tokens = 0


class Context:
    """One llama.cpp context of `n_ctx` KV cells and `n_seq_max` sequences: one pool shared by them all
    (unified), or a stream of `n_ctx_seq` cells per sequence."""

    def __init__(self, model: Model, shape: ContextShape):
        lib = bindings()
        params = lib.llama_context_default_params()
        params.n_ctx = shape.n_ctx
        params.n_batch = shape.n_batch
        params.n_ubatch = shape.n_ubatch
        params.n_seq_max = shape.n_seq_max
        params.n_threads = shape.n_threads
        params.n_threads_batch = shape.n_threads
        params.kv_unified = shape.unified
        params.no_perf = True
        self._lib = lib
        self.handle = lib.llama_init_from_model(model.handle, params)
        if not self.handle:
            raise RuntimeError(f"llama.cpp could not create a context of {shape.n_ctx} cells")
        self._memory = lib.llama_get_memory(self.handle)
        self.n_ctx = lib.llama_n_ctx(self.handle)
        self.n_ctx_seq = lib.llama_n_ctx_seq(self.handle)  # the cells one sequence can hold
        self.unified = shape.unified
        self.n_seq_max = lib.llama_n_seq_max(self.handle)
        self.n_vocab = lib.llama_vocab_n_tokens(model.vocab)
        self.batch = Batch(shape.n_batch)
        self.threads = shape.n_threads
        self._logits_at = 0  # the address of llama.cpp's logits buffer when `_logits` was made over it
        self._logits: np.ndarray | None = None

    def set_threads(self, threads: int) -> None:
        """The threads the next decodes run on (a setting of the context: nothing is started or stopped)."""
        if threads != self.threads:
            self._lib.llama_set_n_threads(self.handle, threads, threads)
            self.threads = threads

    def decode(self, n_tokens: int) -> int:
        """Run the first `n_tokens` rows of the batch. 0: done; 1: no room in the KV cache (nothing was
        changed); other values are llama.cpp errors. Releases the GIL while it runs."""
        self.batch.struct.n_tokens = n_tokens
        return self._lib.llama_decode(self.handle, self.batch.struct)

    def logits(self, rows: int) -> np.ndarray:
        """The last decode's logits, one row per batch token that asked for them, in batch order: a view of
        llama.cpp's buffer (float32 [rows, n_vocab]), valid until the next decode."""
        pointer = self._lib.llama_get_logits(self.handle)
        if rows > self.n_seq_max:  # more than one row per sequence: not a step of the engine loop
            return np.ctypeslib.as_array(pointer, shape=(rows, self.n_vocab))
        address = ctypes.cast(pointer, ctypes.c_void_p).value
        if address != self._logits_at:  # llama.cpp (re)allocated it: room for at least one row per sequence
            self._logits_at = address
            self._logits = np.ctypeslib.as_array(pointer, shape=(self.n_seq_max, self.n_vocab))
        return self._logits[:rows]

    def seq_truncate(self, seq: int, keep: int) -> bool:
        """Drop the sequence's cells from position `keep` on (keep=0 empties it)."""
        return bool(self._lib.llama_memory_seq_rm(self._memory, seq, keep, -1))

    def seq_state(self, seq: int) -> bytearray:
        """A copy of one sequence's KV cells (host memory), to restore later with `set_seq_state`. llama.cpp
        writes it straight into the buffer kept (a second copy of ~3 MB cost as much as the first, on the step's
        thread)."""
        size = self._lib.llama_state_seq_get_size(self.handle, seq)
        state = bytearray(size)
        into = (ctypes.c_uint8 * size).from_buffer(state)
        written = self._lib.llama_state_seq_get_data(self.handle, into, size, seq)
        del into  # the buffer may be resized only once no view of it is left
        del state[written:]
        return state

    def set_seq_state(self, seq: int, state: bytearray) -> bool:
        """Replace one sequence's cells with a copy taken by `seq_state` (read in place); False if it did not
        fit."""
        buffer = (ctypes.c_uint8 * len(state)).from_buffer(state)
        return self._lib.llama_state_seq_set_data(self.handle, buffer, len(state), seq) > 0

    def free(self) -> None:
        if self.handle:
            self._lib.llama_free(self.handle)
            self.handle = None

