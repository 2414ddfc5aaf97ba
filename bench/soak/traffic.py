"""The mixed traffic of a soak run, per server, all at once:

- clients on the server's always-loaded models, each sending one request after another: streams read to the
  end, non-streaming requests, and streams it cuts at a random point;
- clients on a pair of models that do not fit in memory together: they all ask the pair's current model,
  which a swap driver changes every phase, so each change evicts one model and loads the other; every few
  changes the driver does it by hand instead (waits for the pair's requests to finish, unloads the old model
  and loads the new one through the admin API);
- invalid requests (each kind once per round), each of which must get a 4xx with OpenAI's error object;
- probes: /health, /ready, /metrics, /v1/models.

Every choice (model, kind, lengths, cut points, pauses, which invalid request) comes from random generators
seeded from the run's seed, one per actor and period.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from bench.soak.bad_requests import bad_requests, send_bad
from bench.soak.control import PROBES, admin_call, probe
from bench.soak.requests import Outcome, PlannedRequest, send_complete, send_cut, send_stream
from bench.soak.tally import Tally
from orchestrator.bench.http_client import ConnectionPool
from orchestrator.bench.prompts import WORDS

UNLOAD_TRIES = 10
ADMIN_TIMEOUT_S = 300.0  # an admin load waits for the model's load


@dataclass(frozen=True)
class Mix:
    """What each generation client sends: kinds by weight, lengths, pauses between requests."""

    stream: float = 0.5
    complete: float = 0.25
    cut: float = 0.25
    max_tokens: tuple[int, int] = (8, 64)
    pause_s: tuple[float, float] = (0.0, 0.5)

    def describe(self) -> dict:
        return {"weights": {"stream": self.stream, "complete": self.complete, "cut": self.cut},
                "max_tokens": list(self.max_tokens), "pause_s": list(self.pause_s)}


@dataclass(frozen=True)
class ServerTraffic:
    """The traffic one server gets."""

    name: str
    base_url: str
    hot_models: tuple[str, ...]  # always loaded (pinned)
    clients: int
    mix: Mix
    swap_models: tuple[str, ...] = ()  # two models that do not fit together
    swap_clients: int = 0
    phase_s: float = 60.0  # how long the pair keeps one model before the driver changes it
    admin_every: int = 3  # every n-th change is made through the admin API
    bad_every_s: float = 1.0
    probe_every_s: float = 1.0
    timeout_s: float = 120.0

    def describe(self) -> dict:
        return {"hot_models": list(self.hot_models), "clients": self.clients, "mix": self.mix.describe(),
                "swap_models": list(self.swap_models), "swap_clients": self.swap_clients, "phase_s": self.phase_s,
                "admin_every": self.admin_every, "bad_every_s": self.bad_every_s, "probe_every_s": self.probe_every_s}


@dataclass
class SwapState:
    """The pair's current model, kept across periods; `open` is cleared while the driver swaps by hand."""

    models: tuple[str, ...]
    current: int = 0
    changes: int = 0
    in_flight: int = 0
    open: asyncio.Event = field(default_factory=asyncio.Event)
    drained: asyncio.Condition = field(default_factory=asyncio.Condition)

    def __post_init__(self) -> None:
        self.open.set()

    @property
    def model(self) -> str:
        return self.models[self.current]


def generation(rng: random.Random, model: str, mix: Mix) -> PlannedRequest:
    """One request drawn from `rng`: its kind, prompt, lengths and, for a cut, where it is cut."""
    kind = rng.choices(("stream", "complete", "cut"), (mix.stream, mix.complete, mix.cut))[0]
    max_tokens = rng.randint(*mix.max_tokens)
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 40)))
    cut_events = cut_s = None
    if kind == "cut":
        if rng.random() < 0.5:
            cut_events = rng.randint(1, max_tokens)
        else:
            cut_s = rng.uniform(0.0, 0.5)
    return PlannedRequest(model, prompt, max_tokens, chat=rng.random() < 0.5, stream=kind != "complete",
                      seed=rng.randrange(2**31), cut_after_events=cut_events, cut_after_s=cut_s)


async def send(pool: ConnectionPool, request: PlannedRequest, timeout_s: float) -> Outcome:
    if request.cut_after_events is not None or request.cut_after_s is not None:
        return await send_cut(pool, request, timeout_s)
    if request.stream:
        return await send_stream(pool, request, timeout_s)
    return await send_complete(pool, request, timeout_s)


async def pause(stop: asyncio.Event, seconds: float) -> None:
    """Sleep, or less once `stop` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


class Period:
    """One stretch of traffic against every server; `stop` ends it after the requests in flight."""

    def __init__(self, servers: list[ServerTraffic], swaps: dict[str, SwapState], tally: Tally, seed: str):
        self.servers, self.swaps, self.tally, self.seed = servers, swaps, tally, seed
        self.stop = asyncio.Event()
        self.pools: list[ConnectionPool] = []
        self.session: aiohttp.ClientSession | None = None

    def _rng(self, *names: object) -> random.Random:
        return random.Random(":".join(map(str, (self.seed, *names))))

    async def _count(self, server: str, work: Awaitable[Outcome]) -> Outcome:
        outcome = await work
        self.tally.add(server, outcome)
        return outcome

    async def hot_client(self, server: ServerTraffic, index: int) -> None:
        rng, pool = self._rng(server.name, "hot", index), self._pool(server)
        while not self.stop.is_set():
            request = generation(rng, rng.choice(server.hot_models), server.mix)
            await self._count(server.name, send(pool, request, server.timeout_s))
            await pause(self.stop, rng.uniform(*server.mix.pause_s))

    async def swap_client(self, server: ServerTraffic, index: int) -> None:
        rng, pool, state = self._rng(server.name, "swap", index), self._pool(server), self.swaps[server.name]
        while not self.stop.is_set():
            await state.open.wait()
            request = generation(rng, state.model, server.mix)
            state.in_flight += 1
            try:
                await self._count(server.name, send(pool, request, server.timeout_s))
            finally:
                state.in_flight -= 1
                async with state.drained:
                    state.drained.notify_all()
            await pause(self.stop, rng.uniform(*server.mix.pause_s))

    async def swap_driver(self, server: ServerTraffic) -> None:
        state = self.swaps[server.name]
        while True:
            await pause(self.stop, server.phase_s)
            if self.stop.is_set():
                return
            state.changes += 1
            if state.changes % server.admin_every:
                state.current = 1 - state.current  # the next request evicts one model and loads the other
            else:
                await self._swap_by_hand(server, state)

    async def _swap_by_hand(self, server: ServerTraffic, state: SwapState) -> None:
        """Hold the pair's clients, let their requests finish, unload the old model, load the new one."""
        old, new = state.model, state.models[1 - state.current]
        state.open.clear()
        try:
            async with state.drained:
                await state.drained.wait_for(lambda: state.in_flight == 0)
            for _ in range(UNLOAD_TRIES):  # a request of a client that just stopped may still be leaving
                outcome = await self._count(server.name, admin_call(self.session, server.base_url, old, "unload"))
                if outcome.note != "unload refused: busy":
                    break
                await asyncio.sleep(0.5)
            await self._count(server.name, admin_call(self.session, server.base_url, new, "load"))
            state.current = 1 - state.current
        finally:
            state.open.set()

    async def bad_client(self, server: ServerTraffic) -> None:
        rng, pool = self._rng(server.name, "bad"), self._pool(server)
        catalogue, order = bad_requests(server.hot_models[0]), []
        while not self.stop.is_set():
            if not order:  # every invalid request once per round, in a seeded order
                order = rng.sample(catalogue, len(catalogue))
            bad = order.pop()
            outcome, status = await send_bad(pool, bad, server.timeout_s)
            self.tally.add(server.name, outcome)
            self.tally.bad_statuses[bad.name][str(status)] += 1
            await pause(self.stop, rng.uniform(0, 2 * server.bad_every_s))

    async def prober(self, server: ServerTraffic) -> None:
        rng = self._rng(server.name, "probe")
        while not self.stop.is_set():
            await self._count(server.name, probe(self.session, server.base_url, rng.choice(PROBES)))
            await pause(self.stop, rng.uniform(0, 2 * server.probe_every_s))

    def _pool(self, server: ServerTraffic) -> ConnectionPool:
        pool = ConnectionPool(server.base_url)
        self.pools.append(pool)
        return pool

    def _actors(self) -> list[Callable[[], Awaitable[None]]]:
        actors = []
        for server in self.servers:
            actors += [lambda s=server, i=i: self.hot_client(s, i) for i in range(server.clients)]
            if server.swap_models:
                actors += [lambda s=server, i=i: self.swap_client(s, i) for i in range(server.swap_clients)]
                actors.append(lambda s=server: self.swap_driver(s))
            actors += [lambda s=server: self.bad_client(s), lambda s=server: self.prober(s)]
        return actors

    async def run(self, duration_s: float, grace_s: float) -> int:
        """Traffic for `duration_s`; then the actors finish what they are doing (within `grace_s`, after
        which they are cancelled, which cuts their requests) and every connection is closed. Returns how many
        actors had to be cancelled. An actor that fails (a bug in the run, not in the server) stops the run."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=ADMIN_TIMEOUT_S)) as self.session:
            tasks = [asyncio.create_task(actor()) for actor in self._actors()]
            try:
                ended, _ = await asyncio.wait(tasks, timeout=duration_s, return_when=asyncio.FIRST_COMPLETED)
                for task in ended:
                    task.result()  # before the stop an actor ends only by raising
                self.stop.set()
                _, late = await asyncio.wait(tasks, timeout=grace_s)
                for task in late:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                for task in tasks:
                    if not task.cancelled() and task.exception() is not None:
                        raise task.exception()
                return len(late)
            finally:
                for task in tasks:
                    task.cancel()
                for pool in self.pools:
                    pool.close()
