"""`make test-agents`: real coding agents (Codex CLI, Claude Code) each complete a turn against a real Inferno.

It starts `inferno serve` on a free port with the long-context engine (smollm2-135m-32k: a coding agent's first
request is 10k to 20k tokens) and an audit log, in a temporary folder that also holds each client's home and
configuration (nothing outside it is read or written), then runs `codex exec PROMPT` (Responses API) and
`claude -p PROMPT` (Messages API) one after the other, with timeouts, pointed at it. A client passes when it
exits 0, prints a non-empty answer, and every request the audit log shows on its path was answered 200. It
prints what each client printed and the audit lines of its requests, and exits 0 only if both passed.

This is a script rather than a pytest test: it needs the clients from npm (`make test-agents` installs them into
.agents/) and runs for minutes, and its output (what each agent printed) is the thing to read.

    python -m tests.agents.run --engines-dir engines [--agents-dir .agents] [--only codex] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.launch import ServerProcess, start_server

MODEL = "smollm2-135m-32k"
PROMPT = "Say hello in one short sentence. Do not run any commands."
API_KEY = "inferno-agents-test"  # the server runs without keys; the clients insist on sending one
MAX_TOKENS = 1024  # the server's ceiling per answer, and what Claude Code asks for (it asks for 32,000 by default)
# Claude Code's coding tools. With all its tools its first request is ~20k tokens, far past the 8k the embedded
# default's weights were trained on: served (answered 200), but the model then writes until MAX_TOKENS, and
# Claude Code in -p mode ends a turn cut at its output maximum with an error (exit 1). The protocol is the same
# either way; this keeps the answer within what the model can do.
CLAUDE_TOOLS = "Bash,Read,Edit,Write,Glob,Grep"


@dataclass(frozen=True)
class Client:
    name: str
    path: str  # the API path its turns go to
    argv: list[str]
    env: dict[str, str]
    cwd: Path


def codex_config(base_url: str, model: str) -> str:
    """Codex CLI's config.toml: Inferno as a Responses API provider, and nothing reached elsewhere (without these
    switches it looks up api.github.com, chatgpt.com and ab.chatgpt.com: update check, plugins, metrics).
    A long prefill sends no event for minutes on a CPU, so the stream's idle timeout is raised, and a failed
    request is not retried (a retry would only prefill again)."""
    return f"""model = "{model}"
model_provider = "inferno"
model_context_window = 32768
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false
apps = false

[model_providers.inferno]
name = "Inferno"
base_url = "{base_url}/v1"
wire_api = "responses"
env_key = "INFERNO_API_KEY"
stream_idle_timeout_ms = 1800000
request_max_retries = 0
stream_max_retries = 0
"""


def codex(agents: Path, base_url: str, model: str, home: Path) -> Client:
    codex_home = home / "codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(codex_config(base_url, model))
    env = {"HOME": str(home), "CODEX_HOME": str(codex_home), "INFERNO_API_KEY": API_KEY}
    argv = [str(agents / "node_modules" / ".bin" / "codex"), "exec", "--skip-git-repo-check", PROMPT]
    return Client("codex", "/v1/responses", argv, env, home / "work")


def claude(agents: Path, base_url: str, model: str, home: Path, tools: str) -> Client:
    """Claude Code through its environment: the base URL, a key, the model for every role, no telemetry or other
    traffic, a bounded answer, and a request timeout longer than a long prefill on a CPU."""
    env = {
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / "claude"),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(MAX_TOKENS),
        "API_TIMEOUT_MS": "1800000",
        "CLAUDE_STREAM_IDLE_TIMEOUT_MS": "1800000",  # its stream watchdog gives up after 5 minutes without output
    }
    argv = [str(agents / "node_modules" / ".bin" / "claude"), "-p", PROMPT, f"--tools={tools}"]
    return Client("claude", "/v1/messages", argv, env, home / "work")


@dataclass
class Outcome:
    client: Client
    returncode: int | None  # None: killed at the timeout
    output: str
    seconds: float
    audit: list[dict]

    def problems(self) -> list[str]:
        found = []
        if self.returncode is None:
            found.append("it did not finish before the timeout")
        elif self.returncode != 0:
            found.append(f"it exited {self.returncode}")
        if not self.output.strip():
            found.append("it printed no answer")
        mine = [line for line in self.audit if line.get("path", "").startswith(self.client.path)]
        if not mine:
            found.append(f"the server's audit log shows no request to {self.client.path}")
        found += [f"{line['method']} {line['path']} was answered {line.get('status')}"
                  for line in mine if line.get("status") != 200]
        return found


def run_client(client: Client, audit_file: Path, timeout_s: float) -> Outcome:
    """Run one client to its end (or the timeout) and collect the audit lines written meanwhile."""
    client.cwd.mkdir(parents=True, exist_ok=True)
    before = len(_audit_lines(audit_file))
    env = {"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8", **client.env}
    started = time.monotonic()
    try:
        done = subprocess.run(client.argv, cwd=client.cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
        returncode, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as expired:
        returncode, stdout, stderr = None, _text(expired.stdout), _text(expired.stderr)
    seconds = time.monotonic() - started
    _print_run(client, stdout, stderr, returncode, seconds)
    time.sleep(0.5)  # the audit log is written by a thread of the server's own
    return Outcome(client, returncode, stdout, seconds, _audit_lines(audit_file)[before:])


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _audit_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _print_run(client: Client, stdout: str, stderr: str, returncode: int | None, seconds: float) -> None:
    ended = "timed out" if returncode is None else f"exited {returncode}"
    print(f"\n=== {client.name}: {' '.join(client.argv[1:])}  ({ended} after {seconds:.0f} s)", flush=True)
    print(f"--- {client.name} printed (stdout):\n{stdout.rstrip()}")
    print(f"--- {client.name} stderr (last 40 lines):\n" + "\n".join(stderr.rstrip().splitlines()[-40:]), flush=True)


def report(outcome: Outcome, server: ServerProcess) -> bool:
    """Print the audit lines of the client's requests and its verdict; True when it passed."""
    name = outcome.client.name
    print(f"--- {name}: the server's audit log")
    for line in outcome.audit:
        print(f"  {line.get('method')} {line.get('path')} -> {line.get('status')} "
              f"prompt_tokens={line.get('prompt_tokens')} completion_tokens={line.get('completion_tokens')} "
              f"latency_s={line.get('latency_s')} finish={line.get('finish_reason')}")
    problems = outcome.problems()
    if not problems:
        print(f"PASS {name}: completed a turn in {outcome.seconds:.0f} s")
        return True
    print(f"FAIL {name}: " + "; ".join(problems))
    path = outcome.client.path
    mentions = [line for line in server.log().splitlines() if path in line][-10:]
    if mentions:
        print(f"--- the server's log about {path}:\n" + "\n".join(mentions))
    return False


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines-dir", type=Path, default=Path("engines"), help="holds the built engine")
    parser.add_argument("--model", default=MODEL, help="the engine to serve (a long-context one)")
    parser.add_argument("--agents-dir", type=Path, default=Path(".agents"), help="npm prefix of the two clients")
    parser.add_argument("--only", choices=("codex", "claude"), help="run one client")
    parser.add_argument("--timeout-s", type=float, default=1500, help="per client")
    parser.add_argument("--threads", type=int, help="llama.cpp threads (the server's default: all cores but one)")
    parser.add_argument("--claude-tools", default=CLAUDE_TOOLS,
                        help="Claude Code's --tools: its coding tools (the default, ~4.4k tokens of prompt) or "
                             "'default' (all of them, ~20k tokens)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, homes, audit)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    folder = Path(tempfile.mkdtemp(prefix="inferno-agents-"))
    audit = folder / "audit.jsonl"
    extra = ["--models", args.model, "--audit.file", str(audit), "--scheduling.max-tokens", str(MAX_TOKENS)]
    extra += ["--worker.threads", str(args.threads)] if args.threads else []
    server = start_server(args.engines_dir.resolve(), folder / "server.log", *extra, timeout_s=600)
    print(f"inferno serve ready at {server.base_url} ({args.model}); files in {folder}", flush=True)
    agents = args.agents_dir.resolve()
    clients = [codex(agents, server.base_url, args.model, folder / "codex-home"),
               claude(agents, server.base_url, args.model, folder / "claude-home", args.claude_tools)]
    try:
        passed = [report(run_client(c, audit, args.timeout_s), server)
                  for c in clients if args.only in (None, c.name)]
    finally:
        server.stop()
    print(f"\n{sum(passed)} of {len(passed)} clients completed a turn" + ("" if args.keep else "; removing " + str(folder)))
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return 0 if passed and all(passed) else 1


if __name__ == "__main__":
    sys.exit(main())
