"""The `inferno` command: serve, build, models catalogue, bench."""

from __future__ import annotations

import sys

USAGE = """usage: inferno <command> [options]

commands:
  serve             serve every engine under engines/ (inferno serve --help lists the settings)
  build MODEL       build an engine ahead of time (inferno build --help)
  models catalogue    list the models that can be built
  bench             benchmark an OpenAI-compatible server (inferno bench --help)
  keys new NAME     make an API key and its keys-file entry (its hash)
  keys hash         hash a key read from standard input, for a keys file
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "serve":
        from orchestrator.config import load_config
        from orchestrator.server import run

        return run(load_config(rest))
    if command == "build":
        from build_scripts.cli import build_command

        return build_command(rest)
    if command == "bench":
        from orchestrator.bench.cli import bench_command

        return bench_command(rest)
    if command == "keys":
        from orchestrator.access.keys_command import keys_command

        return keys_command(rest)
    if command == "models" and rest[:1] in (["catalogue"], ["catalog"]):  # the older spelling still works
        from build_scripts.cli import catalogue_command

        return catalogue_command(rest[1:])
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
