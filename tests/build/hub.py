"""A Hugging Face Hub on loopback, for the fetch tests: the endpoints huggingface_hub calls to list and download
a model repository, serving repositories the tests make.

- GET  /api/models/<org>/<name>[/revision/<rev>]   model info, with each file's size, blob id and LFS sha256
- GET  /api/models/<org>/<name>/tree/<rev>[/<path>]   the file tree (verify_repo_checksums, snapshot_download)
- HEAD/GET /<org>/<name>/resolve/<rev>/<file>   the file, with X-Repo-Commit, ETag (the LFS sha256, else the
  git blob id) and Content-Length; GET honours `Range: bytes=N-` (206 and Content-Range), as resumes need

Each repository can be gated (401 with X-Error-Code: GatedRepo without an Authorization header), serve a
file corrupted (same size, other bytes than its hashes say), cut the first response of a file short of its end,
or stall it there (the bytes sent, then nothing until the client goes away: a build killed mid-file).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Repo:
    files: dict[str, bytes]
    gated: bool = False
    corrupt: set[str] = field(default_factory=set)  # served with one byte flipped
    cut_once: set[str] = field(default_factory=set)  # the first GET stops 4 KiB short of the end
    stall_once: set[str] = field(default_factory=set)  # the first GET sends as much, then waits for the client to go

    @property
    def commit(self) -> str:
        digest = hashlib.sha1()
        for name in sorted(self.files):
            digest.update(name.encode() + b"\0" + self.files[name])
        return digest.hexdigest()


def is_lfs(name: str) -> bool:
    return name.endswith((".safetensors", ".pth", ".bin"))


def blob_id(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _entry(name: str, content: bytes) -> dict:
    lfs = {"sha256": hashlib.sha256(content).hexdigest(), "size": len(content), "pointerSize": 134}
    return {"name": name, "size": len(content), "blob": blob_id(content), "lfs": lfs if is_lfs(name) else None}


class LoopbackHub:
    """The server, run on its own event loop in a thread; `requests` records (method, path, Range header)."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None

    def start(self) -> LoopbackHub:
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(10)
        return self

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/api/models/{org}/{name}", self._info)
        app.router.add_get("/api/models/{org}/{name}/revision/{rev}", self._info)
        app.router.add_get("/api/models/{org}/{name}/tree/{rev}{path:(/.*)?}", self._tree)
        app.router.add_route("*", "/{org}/{name}/resolve/{rev}/{path:.+}", self._resolve)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _repo(self, request: web.Request) -> tuple[str, Repo]:
        self.requests.append((request.method, request.path, request.headers.get("Range")))
        name = f"{request.match_info['org']}/{request.match_info['name']}"
        repo = self.repos.get(name)
        if repo is None:
            raise web.HTTPNotFound(headers={"X-Error-Code": "RepoNotFound"})
        if repo.gated and "Authorization" not in request.headers:
            raise web.HTTPUnauthorized(headers={"X-Error-Code": "GatedRepo",
                                                "X-Error-Message": f"Access to model {name} is restricted."})
        return name, repo

    async def _info(self, request: web.Request) -> web.Response:
        name, repo = self._repo(request)
        siblings = []
        for file, content in sorted(repo.files.items()):
            entry = _entry(file, content)
            siblings.append({"rfilename": file, "size": entry["size"], "blobId": entry["blob"], "lfs": entry["lfs"]})
        return web.json_response({"id": name, "modelId": name, "sha": repo.commit, "private": False,
                                  "gated": "manual" if repo.gated else False, "siblings": siblings})

    async def _tree(self, request: web.Request) -> web.Response:
        _, repo = self._repo(request)
        tree = []
        for file, content in sorted(repo.files.items()):
            entry = _entry(file, content)
            lfs = entry["lfs"] and {"oid": entry["lfs"]["sha256"], "size": entry["size"], "pointerSize": 134}
            tree.append({"type": "file", "oid": entry["blob"], "size": entry["size"], "path": file,
                         **({"lfs": lfs} if lfs else {})})
        return web.json_response(tree)

    async def _resolve(self, request: web.Request) -> web.StreamResponse:
        _, repo = self._repo(request)
        path = request.match_info["path"]
        if path not in repo.files:
            raise web.HTTPNotFound(headers={"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.commit})
        content = repo.files[path]
        entry = _entry(path, content)
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{entry["lfs"]["sha256"] if entry["lfs"] else entry["blob"]}"',
                   "Accept-Ranges": "bytes", "Content-Disposition": f'inline; filename="{path.rsplit("/", 1)[-1]}";'}
        if path in repo.corrupt:
            content = bytes([content[0] ^ 0xFF]) + content[1:]
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(len(content))})
        return await self._send(request, repo, path, content, headers)

    async def _send(self, request: web.Request, repo: Repo, path: str, content: bytes, headers: dict) -> web.StreamResponse:
        start = int(request.http_range.start or 0)
        status = 206 if start else 200
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = len(content) - start
        await response.prepare(request)
        if path in repo.cut_once | repo.stall_once:
            # Short of the end, past huggingface_hub's 10 MiB read size for a large file, so that what it read is kept
            await response.write(content[start:max(start, len(content) - 4096)])
            if path in repo.cut_once:
                repo.cut_once.discard(path)
                request.transport.abort()  # the connection drops with the body half sent
            else:
                repo.stall_once.discard(path)
                while request.transport is not None and not request.transport.is_closing():
                    await asyncio.sleep(0.05)  # until the client is gone
            return response
        await response.write(content[start:])
        await response.write_eof()
        return response
