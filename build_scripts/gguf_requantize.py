"""Write a GGUF file's weights as another llama.cpp file type, e.g. the embedded default's Q4_1 file as F16.

    python -m build_scripts.gguf_requantize SOURCE.gguf TARGET.gguf F16

Run by the GGUF engine build as its own process (llama.cpp aborts its process on some errors), for recipes
with a `target.gguf_type`. llama.cpp's own quantize API (`llama_model_quantize`, what `llama-quantize
--allow-requantize` calls) through the bindings the backend already uses: quantised tensors are dequantised and
written as the new type, so an F16 file made from a Q4_1 one holds the Q4_1 weights rounded to 16 bits.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

FILE_TYPES = {"F32": "LLAMA_FTYPE_ALL_F32", "F16": "LLAMA_FTYPE_MOSTLY_F16", "BF16": "LLAMA_FTYPE_MOSTLY_BF16"}


def requantize(source: Path, target: Path, file_type: str) -> None:
    """Write `source`'s weights to `target` as one of FILE_TYPES, converting quantised tensors too
    (allow_requantize, as `llama-quantize --allow-requantize`), with a thread per core (nthread 0)."""
    from orchestrator.backends.llamacpp.api import bindings

    lib = bindings()
    params = lib.llama_model_quantize_default_params()
    params.ftype = getattr(lib, FILE_TYPES[file_type])
    params.allow_requantize = True
    params.nthread = 0
    if lib.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama.cpp could not write {source} as {file_type} to {target}")


def main(argv: list[str]) -> int:
    source, target, file_type = argv
    requantize(Path(source), Path(target), file_type)
    print(f"wrote {target} ({Path(target).stat().st_size:,} bytes) as {file_type} from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
