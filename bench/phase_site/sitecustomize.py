"""On PYTHONPATH for `python -m bench.phase_cpu` (bench/phase_cpu.py): in the server's process and its
workers, the request path's phases are timed; any other Python process is left as it is."""

import sys
from pathlib import Path


def _install() -> None:
    command_line = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for `bench`
    from bench.phase_cpu import install, role_of

    role = role_of(command_line)
    if role is not None:
        install(role)


_install()
