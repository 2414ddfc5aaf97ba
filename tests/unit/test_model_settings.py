"""Per-model settings: the file, its defaults, and the server config beneath them."""

from __future__ import annotations

import pytest

from orchestrator.backends.options import prompt_cache_budget
from orchestrator.config import load_config
from orchestrator.errors import InvalidRequest
from orchestrator.scheduler.settings import Priority, SettingsError, load_model_settings, request_priority


def settings_file(tmp_path, text):
    path = tmp_path / "models.toml"
    path.write_text(text)
    return path


def test_without_a_file_the_server_config_applies():
    config = load_config(["--scheduling.keep-alive-s", "30", "--scheduling.max-queue", "5"])
    settings = load_model_settings(config, ["a"])["a"]
    assert (settings.keep_alive_s, settings.max_queue, settings.pinned) == (30, 5, False)
    assert settings.priority_class is Priority.INTERACTIVE


def test_file_entries_override_file_defaults_override_config(tmp_path):
    path = settings_file(
        tmp_path,
        """
        [defaults]
        keep_alive_s = 60
        [models.a]
        pinned = true
        priority = "batch"
        weight = 2.5
        """,
    )
    config = load_config(["--model-settings", str(path), "--scheduling.keep-alive-s", "10"])
    settings = load_model_settings(config, ["a", "b"])
    assert settings["a"].pinned and settings["a"].priority_class is Priority.BATCH and settings["a"].weight == 2.5
    assert settings["a"].keep_alive_s == 60 and settings["b"].keep_alive_s == 60
    assert not settings["b"].pinned


def test_settings_for_a_model_without_an_engine_are_an_error(tmp_path):
    path = settings_file(tmp_path, "[models.ghost]\npinned = true\n")
    with pytest.raises(SettingsError, match="ghost"):
        load_model_settings(load_config(["--model-settings", str(path)]), ["a"])


def test_bad_values_are_an_error(tmp_path):
    path = settings_file(tmp_path, '[models.a]\npriority = "urgent"\n')
    with pytest.raises(SettingsError):
        load_model_settings(load_config(["--model-settings", str(path)]), ["a"])


def test_service_tier_maps_to_priority():
    assert request_priority(None, Priority.BATCH) is Priority.BATCH
    assert request_priority("auto", Priority.INTERACTIVE) is Priority.INTERACTIVE
    assert request_priority("flex", Priority.INTERACTIVE) is Priority.BATCH
    assert request_priority("priority", Priority.BATCH) is Priority.INTERACTIVE
    with pytest.raises(InvalidRequest):
        request_priority("turbo", Priority.BATCH)


def test_a_key_class_is_its_requests_default_and_their_best():
    batch, interactive = Priority.BATCH, Priority.INTERACTIVE
    assert request_priority(None, interactive, key_class=batch) is batch
    assert request_priority("priority", interactive, key_class=batch) is batch  # a batch key cannot ask for more
    assert request_priority(None, batch, key_class=interactive) is interactive
    assert request_priority("flex", batch, key_class=interactive) is batch  # but may ask for less


def test_max_tokens_comes_from_the_file_over_the_config(tmp_path):
    path = settings_file(tmp_path, "[defaults]\nmax_tokens = 512\n[models.a]\nmax_tokens = 64\n")
    config = load_config(["--model-settings", str(path), "--scheduling.max-tokens", "1024"])
    settings = load_model_settings(config, ["a", "b"])
    assert (settings["a"].max_tokens, settings["b"].max_tokens) == (64, 512)
    assert load_model_settings(load_config(["--scheduling.max-tokens", "1024"]), ["a"])["a"].max_tokens == 1024
    assert load_model_settings(load_config([]), ["a"])["a"].max_tokens is None


def test_a_models_prompt_cache_bytes_wins_over_the_workers_and_resolves_per_backend(tmp_path):
    path = settings_file(tmp_path, "[models.a]\nprompt_cache_bytes = 4096\nretain_system_prompt = true\n")
    config = load_config(["--model-settings", str(path), "--worker.prompt-cache-bytes", "1024"])
    settings = load_model_settings(config, ["a", "b"])
    assert (settings["a"].prompt_cache_bytes, settings["a"].retain_system_prompt) == (4096, True)
    assert (settings["b"].prompt_cache_bytes, settings["b"].retain_system_prompt) == (1024, False)
    # Unset: llamacpp keeps half its KV budget in RAM; trtllm and sim pin nothing unless asked; hf has no such cache.
    assert [prompt_cache_budget(b, None, 1000) for b in ("llamacpp", "trtllm", "sim", "hf")] == [500, 0, 0, 0]
    assert [prompt_cache_budget(b, 64, 1000) for b in ("llamacpp", "trtllm", "sim", "hf")] == [64, 64, 64, 0]
