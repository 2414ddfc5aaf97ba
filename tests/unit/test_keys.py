"""API keys: the keys file (TOML or JSON) with its defaults, hashed and plain keys, the compatibility
settings, and the mistakes that stop the server from starting."""

from __future__ import annotations

import json
import logging

import pytest

from orchestrator.access.keys import KeysError, hash_key, load_keys
from orchestrator.config import AuthConfig
from orchestrator.scheduler.settings import Priority

MODELS = ["small", "large"]


def keys_file(tmp_path, text: str, name: str = "keys.toml"):
    path = tmp_path / name
    path.write_text(text)
    return AuthConfig(keys_file=path)


def test_a_hashed_key_is_found_by_its_key_with_its_policy_and_the_defaults(tmp_path):
    auth = keys_file(tmp_path, f"""
        [defaults]
        requests_per_minute = 60
        [keys.alice]
        key = "{hash_key('sk-alice')}"
        models = ["small"]
        tokens_per_minute = 1000
        max_concurrent = 2
        priority = "batch"
        weight = 2.5
        [keys.ops]
        key = "{hash_key('sk-ops')}"
        admin = true
        requests_per_minute = 5
    """)
    ring = load_keys(auth, MODELS)
    alice, ops = ring.find("sk-alice"), ring.find("sk-ops")
    assert ring.find(hash_key("sk-alice")) is None  # the stored hash is not itself a key
    assert ring.find("sk-nobody") is None
    assert (alice.name, alice.models, alice.requests_per_minute, alice.tokens_per_minute) == (
        "alice", frozenset({"small"}), 60, 1000)
    assert alice.max_concurrent == 2 and alice.priority is Priority.BATCH and not alice.admin
    assert alice.may_use("small") and not alice.may_use("large")
    assert ops.admin and ops.models is None and ops.requests_per_minute == 5 and ops.may_use("large")
    assert alice.weight == 2.5 and ops.weight == 1.0  # a key's share next to others; 1 unless it says


def test_json_works_the_same_and_plain_keys_work_with_a_warning(tmp_path, caplog):
    auth = keys_file(tmp_path, json.dumps({"keys": {"bob": {"key": "sk-bob", "models": ["nope"]}}}), "keys.json")
    with caplog.at_level(logging.WARNING, logger="orchestrator.access.keys"):
        ring = load_keys(auth, MODELS)
    assert ring.find("sk-bob").name == "bob"
    warnings = " | ".join(r.getMessage() for r in caplog.records)
    assert "key 'bob' is stored as plain text" in warnings and "sk-bob" not in warnings
    assert "key 'bob' names models this server does not serve: nope" in warnings


def test_compatibility_keys_are_named_by_position_and_may_be_hashed():
    ring = load_keys(AuthConfig(api_keys=("k1", hash_key("k2")), admin_key="root"), MODELS)
    assert [ring.find(k).name for k in ("k1", "k2", "root")] == ["api-key-1", "api-key-2", "admin"]
    assert ring.find("root").admin and not ring.find("k1").admin
    assert not load_keys(AuthConfig(), MODELS).configured


@pytest.mark.parametrize(
    "text, message",
    [
        ('[keys.a]\nkey = "sha256:abc"\n', "a hashed key is sha256: and 64 hex digits"),
        ('[keys.a]\nkey = "x"\n[keys.b]\nkey = "x"\n', "the keys 'a' and 'b' are the same key"),
        ('[keys.a]\nkey = "x"\npriority = "urgent"\n', "key 'a'"),
        ('[keys.a]\nkey = "x"\nrequests_per_minute = 0\n', "greater than or equal to 1"),
        ('[keys.a]\nkey = "x"\nweight = 0\n', "weight"),
        ('[keys.a]\nmodels = ["small"]\n', "key 'a'"),
        ('[keys."a b"]\nkey = "x"\n', "use 1 to 64 letters"),
        ('[keys.a]\nkey = "x"\ncolour = "red"\n', "colour"),
        ("[keys.a\n", "keys.toml"),
    ],
)
def test_mistakes_stop_the_server_with_the_reason(tmp_path, text, message):
    with pytest.raises(KeysError, match=message.replace("(", r"\(")):
        load_keys(keys_file(tmp_path, text), MODELS)


def test_two_keys_of_one_name_are_refused_naming_it(tmp_path):
    twice = '{"keys": {"alice": {"key": "sk-1"}, "alice": {"key": "sk-2", "admin": true}}}'
    with pytest.raises(KeysError, match=r"keys\.json: 'alice' appears twice"):
        load_keys(keys_file(tmp_path, twice, "keys.json"), MODELS)
    named_admin = keys_file(tmp_path, '[keys.admin]\nkey = "sk-1"\n')
    with pytest.raises(KeysError, match="two keys are named 'admin'"):
        load_keys(AuthConfig(keys_file=named_admin.keys_file, admin_key="sk-root"), MODELS)
    named_like_a_flag_key = keys_file(tmp_path, '[keys.api-key-1]\nkey = "sk-1"\n')
    with pytest.raises(KeysError, match="two keys are named 'api-key-1'"):
        load_keys(AuthConfig(keys_file=named_like_a_flag_key.keys_file, api_keys=("sk-2",)), MODELS)


def test_a_missing_keys_file_is_an_error(tmp_path):
    with pytest.raises(KeysError, match=r"missing\.toml"):
        load_keys(AuthConfig(keys_file=tmp_path / "missing.toml"), MODELS)


def test_keys_new_prints_a_key_and_the_entry_that_finds_it(tmp_path, capsys):
    from orchestrator.access.keys_command import keys_command

    assert keys_command(["new", "alice"]) == 0
    out = capsys.readouterr().out
    key = out.split("stored anywhere): ")[1].split()[0]
    entry = out.split("\n\n", 1)[1]
    assert key not in entry
    assert load_keys(keys_file(tmp_path, entry), MODELS).find(key).name == "alice"


def test_keys_hash_reads_the_key_from_standard_input(capsys, monkeypatch):
    import io

    from orchestrator.access.keys_command import keys_command

    monkeypatch.setattr("sys.stdin", io.StringIO("sk-test\n"))
    assert keys_command(["hash"]) == 0
    assert capsys.readouterr().out.strip() == hash_key("sk-test")
    assert keys_command(["hash", "sk-test"]) == 2  # never from the command line
