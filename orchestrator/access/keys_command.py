"""`inferno keys`: make a key and its keys-file entry, or hash a key, so that keys files hold only hashes.

    inferno keys new alice     a fresh key (shown once) and the [keys.alice] entry holding its hash
    inferno keys hash          the sha256:<hex> of a key read from standard input (never an argument:
                               command lines end up in shell histories and process lists)
"""

from __future__ import annotations

import secrets
import sys

from orchestrator.access.keys import KEY_NAME, hash_key

USAGE = "usage: inferno keys new NAME | inferno keys hash  (reads the key on standard input)"


def keys_command(argv: list[str]) -> int:
    if argv[:1] == ["new"] and len(argv) == 2 and KEY_NAME.fullmatch(argv[1]):
        key = "sk-inferno-" + secrets.token_urlsafe(32)
        print(f"key (give it to its user; it is not stored anywhere): {key}\n")
        print(f'[keys.{argv[1]}]\nkey = "{hash_key(key)}"')
        return 0
    if argv == ["hash"]:
        key = sys.stdin.readline().strip()
        if not key:
            print("no key on standard input", file=sys.stderr)
            return 2
        print(hash_key(key))
        return 0
    print(USAGE, file=sys.stderr)
    return 2
