"""Starting `inferno serve` as a child process and waiting until it is ready: for scripts, benchmarks and
tests that drive a real server."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

READY_LINE = re.compile(r"Inferno ready: (http://[\d.]+:\d+)/v1")
PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class ServerProcess:
    process: subprocess.Popen
    base_url: str
    log_path: Path

    @property
    def api(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_server(
    engines_dir: Path, log_path: Path, *args: str, env: dict | None = None, timeout_s: float = 120
) -> ServerProcess:
    """Start `inferno serve` on a free loopback port (port 0) and wait for its ready line."""
    command = [sys.executable, "-m", "orchestrator", "serve", "--port", "0", "--engines-dir", str(engines_dir), *args]
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT, env={**os.environ, **(env or {})}
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = READY_LINE.search(log_path.read_text(errors="replace"))
        if match:
            return ServerProcess(process, match.group(1), log_path)
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"the server did not become ready:\n{log_path.read_text(errors='replace')}")


def copy_engine(source: Path, engines_dir: Path, name: str) -> Path:
    """A second engine folder under another name, sharing the weights by hard link (no second build):
    several "models" from one engine, for trying out multi-model placement."""
    target = engines_dir / name
    shutil.copytree(source, target, copy_function=os.link)
    manifest = target / "engine.json"
    manifest.unlink()  # hard-linked: replace, never edit in place
    text = (source / "engine.json").read_text().replace(f'"name": "{source.name}"', f'"name": "{name}"')
    manifest.write_text(text)
    return target
