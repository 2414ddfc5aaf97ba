"""`inferno bench --scenario two-keys`: does one API key's flood reach another key?

Key A (the flood) streams at `--concurrency` (default 32) with long outputs (`--osl`), in a closed loop; key B (the
victim) sends `--requests` requests one at a time with short outputs (`--victim-osl`). B's requests are sent
twice: alone, then while A floods. The result says B's time to first token alone and under the flood (and their
ratio), and how many of B's requests were refused with 429. A request of A refused with 429 is retried after a
short pause, so a flood that overfills the queue keeps it full without spinning.

With `--engines-dir` the bench starts Inferno with a keys file of its own holding both keys; with `--url`, A's key
is `--api-key` and B's `--victim-key`. The result goes to `two-keys-<time>.json` under `--out`.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from pathlib import Path

from orchestrator.access.keys import hash_key
from orchestrator.bench.options import BenchError, BenchOptions
from orchestrator.bench.prompts import PromptMaker
from orchestrator.bench.record import RequestTiming
from orchestrator.bench.report import header, now
from orchestrator.bench.senders import HttpSender, RequestShape
from orchestrator.bench.stats import distribution, rounded
from orchestrator.bench.targets import Target, connect, start_inferno
from orchestrator.bench.workload import RequestSpec

FLOOD_LEAD_S = 2.0  # the flood runs this long before the victim's first request: every stream of A is sent
REFUSED_PAUSE_S = 1.0  # a flood request refused with 429 is sent again after this (a full queue's Retry-After)
FLOOD_PROMPTS = 64  # distinct prompts the flood cycles through
VICTIM_SEED_OFFSET = 7_919  # the victim's prompts under the flood are not the ones it sent alone (prefix cache)


def open_two_keys(options: BenchOptions, workdir: Path) -> tuple[Target, str | None, str | None]:
    """The target and the two keys (flood, victim)."""
    names = list(options.models.names) if options.models else []
    if options.url:
        if not options.api_key or not options.victim_key:
            raise BenchError("--scenario two-keys with --url needs the flood's key (--api-key) and the victim's "
                             "(--victim-key)")
        return connect(options.url, names, options.api_key, options.server_pid, options.tokenizer), \
            options.api_key, options.victim_key
    if not options.engines_dir:
        raise BenchError("give a target: --url URL or --engines-dir DIR")
    flood, victim = f"sk-flood-{secrets.token_hex(8)}", f"sk-victim-{secrets.token_hex(8)}"
    keys_file = workdir / "keys.toml"
    keys_file.write_text(f'[keys.flood]\nkey = "{hash_key(flood)}"\n[keys.victim]\nkey = "{hash_key(victim)}"\n')
    args = ["--auth.keys-file", str(keys_file), *options.server_args]
    return start_inferno(options.engines_dir, names, args, workdir / "server.log"), flood, victim


def refused(record: RequestTiming) -> bool:
    return record.error is not None and record.error.startswith("HTTP 429")


async def one_at_a_time(sender: HttpSender, prepared: list) -> list[RequestTiming]:
    return [await sender.send(request) for request in prepared]


async def flood_loop(sender: HttpSender, prepared: list, start: int, records: list[RequestTiming]) -> None:
    """One of the flood's streams: a request after another, until cancelled."""
    for index in range(start, 1 << 62):
        record = await sender.send(prepared[index % len(prepared)])
        records.append(record)
        if not record.ok:
            await asyncio.sleep(REFUSED_PAUSE_S)


def victim_summary(records: list[RequestTiming]) -> dict:
    return {"requests": len(records), "ok": sum(r.ok for r in records),
            "rejected_429": sum(refused(r) for r in records),
            "errors": sum(not r.ok and not refused(r) for r in records),
            "ttft_s": distribution([r.ttft for r in records if r.ok and r.ttft is not None]),
            "error_messages": sorted({r.error[:200] for r in records if r.error})[:5]}


def flood_summary(records: list[RequestTiming], seconds: float) -> dict:
    done = [r for r in records if r.ok and r.end is not None]
    return {"requests_finished": len(done), "rejected_429": sum(refused(r) for r in records),
            "errors": sum(not r.ok and not refused(r) for r in records),
            "output_tok_s": rounded(sum(r.tokens for r in done) / seconds if seconds > 0 else None, 2),
            "ttft_s": distribution([r.ttft for r in done if r.ttft is not None])}


class TwoKeys:
    """The requests of both keys, prepared before the clock starts."""

    def __init__(self, options: BenchOptions, target: Target, flood_key: str | None, victim_key: str | None):
        model = options.models.names[0] if options.models else target.models[0]
        maker = PromptMaker(target.tokenizer_dirs.get(model, options.tokenizer), options.chat)
        shape = RequestShape(options.chat, options.ignore_eos, options.temperature)
        self.flood = HttpSender(target.api, shape, options.timeout_s, flood_key)
        self.victim = HttpSender(target.api, shape, options.timeout_s, victim_key)
        count, isl = options.requests or 32, options.isl.mean  # fixed lengths: --length-dist is not used

        def prepared(sender: HttpSender, n: int, osl: int, seed: int) -> list:
            try:
                return [sender.prepare(RequestSpec(i, model, isl, osl),
                                       maker.make(isl, random.Random(seed * 1_000_003 + i))) for i in range(n)]
            except ValueError as exc:
                raise BenchError(str(exc)) from exc

        self.model = model
        self.flood_requests = prepared(self.flood, FLOOD_PROMPTS, options.osl.mean, options.seed + 1)
        self.alone = prepared(self.victim, count, options.victim_osl, options.seed)
        self.under_flood = prepared(self.victim, count, options.victim_osl, options.seed + VICTIM_SEED_OFFSET)
        self.warmup = prepared(self.victim, max(options.warmup, 1), options.victim_osl, options.seed + 2)

    async def run(self, concurrency: int) -> dict:
        for record in await one_at_a_time(self.victim, self.warmup):
            if not record.ok:
                raise BenchError(f"a warm-up request failed: {record.error}")
        alone = await one_at_a_time(self.victim, self.alone)
        flood: list[RequestTiming] = []
        started = time.perf_counter()
        streams = [asyncio.create_task(flood_loop(self.flood, self.flood_requests, i, flood))
                   for i in range(concurrency)]
        try:
            await asyncio.sleep(FLOOD_LEAD_S)
            under = await one_at_a_time(self.victim, self.under_flood)
        finally:
            for stream in streams:
                stream.cancel()
            await asyncio.gather(*streams, return_exceptions=True)
        return {"alone": victim_summary(alone), "under_flood": victim_summary(under),
                "flood": flood_summary(flood, time.perf_counter() - started)}

    def close(self) -> None:
        self.flood.close()
        self.victim.close()


async def run_two_keys(options: BenchOptions, command: list[str], workdir: Path) -> dict:
    """The scenario's result file's content."""
    concurrency = options.concurrency[0] if options.concurrency else 32
    report = header("inferno-bench-two-keys/1", command,
                    options.as_dict() | {"flood_concurrency": concurrency, "flood_lead_s": FLOOD_LEAD_S})
    target, flood_key, victim_key = open_two_keys(options, workdir)
    try:
        report["target"] = target.describe()
        scenario = TwoKeys(options, target, flood_key, victim_key)
        try:
            result = await scenario.run(concurrency)
        finally:
            scenario.close()
    finally:
        target.stop()
    alone, under = result["alone"]["ttft_s"]["p50"], result["under_flood"]["ttft_s"]["p50"]
    report |= {
        "victim": {"alone": result["alone"], "under_flood": result["under_flood"]},
        "flood": result["flood"],
        "victim_ttft_p50_alone_s": alone,
        "victim_ttft_p50_under_flood_s": under,
        "victim_ttft_p50_ratio": round(under / alone, 2) if alone and under else None,
        "victim_429": result["alone"]["rejected_429"] + result["under_flood"]["rejected_429"],
        "errors": result["alone"]["errors"] + result["under_flood"]["errors"] + result["flood"]["errors"],
        "finished_at": now(),
    }
    return report


def summary_lines(report: dict) -> list[str]:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.1f} ms"

    flood = report["flood"]
    return [
        f"victim ttft p50 alone {ms(report['victim_ttft_p50_alone_s'])}, under the flood "
        f"{ms(report['victim_ttft_p50_under_flood_s'])} (x{report['victim_ttft_p50_ratio']}); "
        f"victim 429s: {report['victim_429']}",
        f"flood: {flood['requests_finished']} requests finished, {flood['rejected_429']} refused with 429, "
        f"{flood['output_tok_s']} tok/s",
    ]
