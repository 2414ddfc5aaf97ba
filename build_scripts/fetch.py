"""Fetching a recipe's checkpoint from the Hugging Face Hub, where a hub is allowed.

When a recipe's checkpoint is neither given (--checkpoint) nor in the local Hugging Face cache, the build reads
the repository's file list from the hub (names, sizes, hashes: what --dry-run and preflight show), then
downloads only the files a build uses into the standard cache with huggingface_hub, one file at a time with a
progress bar each and one for the whole fetch. A file's bytes go first to `blobs/<etag>.incomplete` in the
cache, which outlives the process: a connection cut during a file is resumed at once, and a build killed during
a file resumes from what that file holds on the next run (an HTTP range request), while the files it completed
are not fetched again. huggingface_hub then links each blob into the snapshot as it does for its own downloads.
config.json is fetched last and unlinked when a check fails, so a snapshot with one is complete. Everything is
checked against the hub's hashes (LFS sha256, else the git blob id) before the build reads it. Air-gapped sites
switch this off with --offline or HF_HUB_OFFLINE=1. The CLI reads the environment and hands the settings down
as a `Hub`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from huggingface_hub import HfFileMetadata

# What a build reads from a checkpoint: the weights in safetensors form (and their index), the model's config,
# its tokenizer and chat template, its generation config. Never the duplicate weights some repositories carry
# (consolidated *.pth files under original/, PyTorch *.bin files beside the safetensors).
FETCH_PATTERNS = (
    "*.safetensors",
    "*.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)
SKIPPED_PATTERNS = ("original/*", "*.pth")
DEFAULT_ENDPOINT = "https://huggingface.co"


class FetchError(Exception):
    """The checkpoint cannot be fetched; the message says why and what to do."""


@dataclass(frozen=True)
class Hub:
    """Where and how to fetch: the hub's address, the access token (if any), whether fetching is allowed."""

    endpoint: str = DEFAULT_ENDPOINT
    token: str | None = field(default=None, repr=False)
    offline: bool = False


@dataclass(frozen=True)
class HubFile:
    name: str
    size: int
    sha256: str | None  # the LFS object's hash (weights); None for files kept in git (configs, tokenizers)


@dataclass(frozen=True)
class HubCheckpoint:
    """The files to fetch from one revision of a hub repository."""

    repo: str
    revision: str  # the commit the files are read at
    files: tuple[HubFile, ...]
    hub: Hub

    @property
    def total_bytes(self) -> int:
        return sum(file.size for file in self.files)

    def snapshot(self, cache: Path) -> Path:
        """The folder the files appear in once fetched (the cache's own layout)."""
        return cache / f"models--{self.repo.replace('/', '--')}" / "snapshots" / self.revision

    def describe(self) -> str:
        names = ", ".join(f"{file.name} ({size_text(file.size)})" for file in self.files)
        return (f"fetch {len(self.files)} files, {size_text(self.total_bytes)}, of {self.repo} at {self.revision[:12]} "
                f"from {self.hub.endpoint} into the Hugging Face cache: {names}")


def size_text(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def _api(hub: Hub):
    from huggingface_hub import HfApi

    return HfApi(endpoint=hub.endpoint, token=hub.token)


def gated_message(repo: str, hub: Hub) -> str:
    return (
        f"{repo} is a gated repository and {'the token in HF_TOKEN has no access to it' if hub.token else 'no token was given'}: "
        f"accept its licence at {hub.endpoint}/{repo} with your Hugging Face account, then set HF_TOKEN to an access "
        f"token of that account (https://huggingface.co/settings/tokens). Or pass --checkpoint DIR with the weights "
        f"fetched elsewhere"
    )


def list_files(repo: str, hub: Hub) -> HubCheckpoint:
    """The files of `repo` (its main revision) that a build reads, with their sizes and hashes; nothing is
    downloaded. Raises FetchError when the hub refuses or cannot be reached."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
    from huggingface_hub.utils import filter_repo_objects

    try:
        info = _api(hub).model_info(repo, files_metadata=True)
    except GatedRepoError as exc:
        raise FetchError(gated_message(repo, hub)) from exc
    except RepositoryNotFoundError as exc:
        raise FetchError(f"{repo} was not found on {hub.endpoint}, or it is private and HF_TOKEN does not give "
                         f"access to it") from exc
    except Exception as exc:  # any other refusal, or no connection (the hub's HTTP client raises its own errors)
        raise FetchError(f"cannot read {repo}'s file list from {hub.endpoint} ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0]}). Check the network (HF_ENDPOINT for a mirror), or build "
                         f"offline (--offline or HF_HUB_OFFLINE=1) from --checkpoint DIR") from exc
    siblings = {sibling.rfilename: sibling for sibling in info.siblings or ()}
    wanted = filter_repo_objects(siblings, allow_patterns=list(FETCH_PATTERNS), ignore_patterns=list(SKIPPED_PATTERNS))
    files = tuple(
        HubFile(name, siblings[name].size or 0, siblings[name].lfs.sha256 if siblings[name].lfs else None)
        for name in sorted(wanted)
    )
    if not any(file.name.endswith(".safetensors") for file in files):
        raise FetchError(f"{repo} on {hub.endpoint} has no safetensors weights; the build reads only those")
    return HubCheckpoint(repo, info.sha, files, hub)


def fetch(checkpoint: HubCheckpoint, cache: Path) -> Path:
    """Download the files into the cache (the ones already there are kept), then check them against the hub's
    hashes; returns the snapshot folder. Each file has a progress bar, advancing the whole fetch's bar too, and a
    line once done with the running total."""
    from huggingface_hub.errors import GatedRepoError

    done, total = 0, checkpoint.total_bytes
    files = fetch_order(checkpoint.files)
    with _progress(total) as (overall, bar_class):
        for index, file in enumerate(files, 1):
            if (checkpoint.snapshot(cache) / file.name).exists():  # completed by an earlier run
                overall.update(file.size)
            try:
                _download(checkpoint, file, cache, bar_class)
            except GatedRepoError as exc:
                raise FetchError(gated_message(checkpoint.repo, checkpoint.hub)) from exc
            except Exception as exc:  # a refusal, or a connection lost for good (cut ones are resumed first)
                raise FetchError(f"fetching {file.name} of {checkpoint.repo} failed ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0]}); run the build again to resume") from exc
            done += file.size
            overall.write(f"fetched {index}/{len(files)}: {file.name} ({size_text(file.size)}); {size_text(done)} of "
                          f"{size_text(total)} in all", file=sys.stdout)  # above the bars, on a terminal
            sys.stdout.flush()
    verify(checkpoint, cache)
    return checkpoint.snapshot(cache)


def fetch_order(files: tuple[HubFile, ...]) -> tuple[HubFile, ...]:
    """config.json last: the cache lookup takes a snapshot with a config.json for a complete one."""
    return tuple(sorted(files, key=lambda file: file.name == "config.json"))


@contextmanager
def _progress(total: int) -> Iterator[tuple[object, type]]:
    """A bar for the whole fetch, and the class of the per-file bars, which advance it as they advance (a resumed
    file's bar starts at what was there already)."""
    from huggingface_hub.utils import tqdm

    with tqdm(total=total, unit="B", unit_scale=True, desc="in all", disable=None) as overall:  # none in a log
        class FileBar(tqdm):
            def __init__(self, *args, **kwargs) -> None:
                super().__init__(*args, **kwargs)
                overall.update(kwargs.get("initial", 0))

            def update(self, n: float | None = 1) -> bool | None:
                overall.update(n)
                return super().update(n)

        yield overall, FileBar


def _download(checkpoint: HubCheckpoint, file: HubFile, cache: Path, bar_class: type) -> None:
    """One file into the cache: its blob written (or continued) here, then linked by hf_hub_download, which finds
    the blob in place and downloads nothing."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    hub, link = checkpoint.hub, checkpoint.snapshot(cache) / file.name
    if not link.exists():
        url = hf_hub_url(checkpoint.repo, file.name, revision=checkpoint.revision, endpoint=hub.endpoint)
        metadata = get_hf_file_metadata(url, token=hub.token, endpoint=hub.endpoint)
        folder = checkpoint.snapshot(cache).parent.parent
        lock = cache / ".locks" / folder.name / f"{metadata.etag}.lock"  # the lock huggingface_hub takes for it
        lock.parent.mkdir(parents=True, exist_ok=True)
        with WeakFileLock(lock):
            _blob(metadata, folder / "blobs" / metadata.etag, build_hf_headers(token=hub.token), file.name, bar_class)
    hf_hub_download(checkpoint.repo, file.name, revision=checkpoint.revision, cache_dir=cache,
                    endpoint=hub.endpoint, token=hub.token)


def _blob(metadata: HfFileMetadata, blob: Path, headers: dict, name: str, bar_class: type) -> None:
    """Download a file's bytes to `<blob>.incomplete`, continuing from what it holds, then move it to `blob`."""
    from huggingface_hub.file_download import http_get

    if blob.exists():
        return
    partial = blob.with_name(blob.name + ".incomplete")
    partial.parent.mkdir(parents=True, exist_ok=True)
    with partial.open("ab") as out:
        if out.tell() > (metadata.size or 0):  # not a beginning of this file: start again
            out.truncate(0)
        http_get(metadata.location, out, resume_size=out.tell(), headers=headers, expected_size=metadata.size,
                 displayed_filename=name, tqdm_class=bar_class)
    partial.replace(blob)


def verify(checkpoint: HubCheckpoint, cache: Path) -> None:
    """Compare the fetched files with the hub's hashes; a file that differs is removed from the cache (so the
    next build fetches it again) and the build stops."""
    result = _api(checkpoint.hub).verify_repo_checksums(checkpoint.repo, revision=checkpoint.revision, cache_dir=cache)
    fetched = {file.name for file in checkpoint.files}
    bad = [mismatch for mismatch in result.mismatches if mismatch["path"] in fetched]  # dicts: path, expected, ...
    missing = sorted(fetched & set(result.missing_paths))
    for mismatch in bad:
        link = checkpoint.snapshot(cache) / mismatch["path"]
        link.resolve().unlink(missing_ok=True)
        link.unlink(missing_ok=True)
    if bad or missing:
        (checkpoint.snapshot(cache) / "config.json").unlink(missing_ok=True)  # the snapshot is incomplete: fetched again
        details = [f"{m['path']}: {m['algorithm']} {m['actual'][:16]}… where the hub says {m['expected'][:16]}…" for m in bad]
        details += [f"{name}: missing after the download" for name in missing]
        raise FetchError(f"the files fetched from {checkpoint.repo} do not match the hub's hashes ("
                         f"{'; '.join(details)}); they were removed from the cache: run the build again")
    print(f"checked {result.checked_count} files against the hub's hashes", flush=True)
