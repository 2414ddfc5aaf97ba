"""Write a GGUF file's weights as another llama.cpp file type, e.g. the embedded default's Q4_1 file as F16.

    python -m build_scripts.gguf_requantize SOURCE.gguf TARGET.gguf F16

Run by the GGUF engine build as its own process (llama.cpp aborts its process on some errors), for recipes
with a `target.gguf_type`. llama.cpp's own quantize API (`llama_model_quantize`, what `llama-quantize
--allow-requantize` calls) through the bindings the backend already uses: quantised tensors are dequantised and
written as the new type, so an F16 file made from a Q4_1 one holds the Q4_1 weights rounded to 16 bits.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from orchestrator.backends.llamacpp.api import requantize

    source, target, file_type = argv
    requantize(Path(source), Path(target), file_type)
    print(f"wrote {target} ({Path(target).stat().st_size:,} bytes) as {file_type} from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
