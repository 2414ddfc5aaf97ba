"""Load a GGUF engine's model with llama.cpp and check it agrees with the engine's tokenizer.json.

    python -m build_scripts.gguf_check MODEL.gguf TOKENIZER.json FACTS.json

Run by the GGUF engine build as its own process (llama.cpp aborts its process on some errors). Writes what the
manifest needs (vocabulary, layers, KV heads, end-of-generation tokens, llama.cpp's version) to FACTS.json and
exits 1 with the reason if llama.cpp cannot load the file, or if the Hugging Face tokenizer made from the file
gives other token ids than llama.cpp's own for the same text: the server tokenises with tokenizer.json, so the
two must agree.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SAMPLES = (
    "What is the capital of France?",
    "Hello, world! 1234 naïve café — ünïcödé 日本語 🙂",
    "def f(x):\n    return x * 2  # tabs\tand  spaces",
)


def gguf_metadata(path: Path) -> dict:
    """The few GGUF metadata fields the manifest records (head size, file type), read with `gguf`."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    fields = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("tokenizer.ggml.")}
    arch = fields["general.architecture"]
    file_type = fields.get("general.file_type")
    try:
        quantization = gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_") if file_type is not None else None
    except ValueError:
        quantization = f"file_type {file_type}"
    return {
        "architecture": arch,
        "key_length": fields.get(f"{arch}.attention.key_length"),
        "value_length": fields.get(f"{arch}.attention.value_length"),
        "quantization": quantization,
        "name": fields.get("general.name"),
    }


def tokenizer_disagreements(model, tokenizer_path: Path) -> list[str]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    problems = []
    for text in SAMPLES:
        ours = tokenizer.encode(text, add_special_tokens=False).ids
        theirs = model.tokenize(text, special=True)
        if ours != theirs:
            problems.append(f"{text!r}: tokenizer.json gives {ours[:12]}..., llama.cpp gives {theirs[:12]}...")
    return problems


def check(gguf_path: Path, tokenizer_path: Path) -> dict:
    from orchestrator.backends.llamacpp.api import Model, binding_version

    meta = gguf_metadata(gguf_path)
    model = Model(gguf_path, mapped=True)  # the facts and the tokenizer: no weight is read
    try:
        facts = model.facts()
        problems = tokenizer_disagreements(model, tokenizer_path)
    finally:
        model.free()
    if problems:
        raise SystemExit("the tokenizer made from the GGUF file disagrees with llama.cpp's:\n  " + "\n  ".join(problems))
    head_dim = meta["key_length"] or facts.n_embd // facts.n_head
    value_dim = meta["value_length"] or head_dim
    return {
        "llama_cpp_python": binding_version(),
        "description": facts.description,
        "n_vocab": facts.n_vocab,
        "n_layer": facts.n_layer,
        "n_head_kv": facts.n_head_kv,
        "n_ctx_train": facts.n_ctx_train,
        "n_params": facts.n_params,
        "size_bytes": facts.size_bytes,
        "eog_tokens": list(facts.eog_tokens),
        "chat_template": facts.chat_template,
        "kv_bytes_per_token_f16": facts.n_layer * facts.n_head_kv * (head_dim + value_dim) * 2,
        **meta,
    }


def main(argv: list[str]) -> int:
    gguf_path, tokenizer_path, out = (Path(arg) for arg in argv)
    facts = check(gguf_path, tokenizer_path)
    out.write_text(json.dumps(facts, indent=2))
    print(json.dumps({k: v for k, v in facts.items() if k != "chat_template"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
