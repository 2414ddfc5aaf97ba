"""TEST DOUBLE for TensorRT-LLM's build tools, which cannot run without TensorRT-LLM and a GPU.

Copied under the names the planner runs (convert_checkpoint.py, quantize.py, trtllm-build), it accepts
`--flag value` pairs and writes the files the real tool writes, in the layout the TensorRT-LLM 1.2
reference gives (§3: a checkpoint's config.json with its mapping; an engine's config.json with
pretrained_config and build_config, plus rank{N}.engine). The weights are a few bytes. Set
INFERNO_STANDIN_FAIL to a tool name to make that tool fail halfway, after writing some output.
"""

import json
import os
import sys
from pathlib import Path


def parse(argv):
    if len(argv) % 2 or not all(a.startswith("--") for a in argv[::2]):
        sys.exit(f"expected --flag value pairs, got {argv}")
    return {name[2:]: value for name, value in zip(argv[::2], argv[1::2], strict=True)}


def checkpoint(args, quant_algo):
    out = Path(args["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    tp, pp = int(args["tp_size"]), int(args.get("pp_size", 1))
    config = {
        "architecture": "LlamaForCausalLM",
        "dtype": args["dtype"],
        "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
        "quantization": {"quant_algo": quant_algo, "kv_cache_quant_algo": quant_algo},
    }
    (out / "config.json").write_text(json.dumps(config))
    for rank in range(tp * pp):
        (out / f"rank{rank}.safetensors").write_bytes(b"weights")
    return out


def engine(args):
    config = json.loads((Path(args["checkpoint_dir"]) / "config.json").read_text())
    out = Path(args["output_dir"])
    build_config = {key: int(args[key]) for key in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens")}
    build_config["plugin_config"] = {key: value for key, value in args.items() if key.endswith(("plugin", "fmha"))}
    (out / "config.json").write_text(json.dumps({"version": "1.2.1", "pretrained_config": config,
                                                 "build_config": build_config}))
    for rank in range(config["mapping"]["world_size"]):
        (out / f"rank{rank}.engine").write_bytes(b"plan" * 256)
    Path("model.cache").write_bytes(b"timing cache")  # the real tool leaves one in its working folder


def main():
    tool = Path(sys.argv[0]).name
    args = parse(sys.argv[1:])
    print(f"[stand-in {tool}] {args}")
    if tool == "trtllm-build":
        engine(args)
    else:
        checkpoint(args, "FP8" if tool == "quantize.py" else None)
    if os.environ.get("INFERNO_STANDIN_FAIL") == tool:
        sys.exit(f"[stand-in {tool}] failing as asked")


main()
