"""What the aiohttp app holds, under one typed key."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry

from orchestrator.access.audit import AuditLog
from orchestrator.access.keys import KeyRing
from orchestrator.access.limits import KeyLimiters
from orchestrator.access.usage import UsageMeter
from orchestrator.api.responses_api.registry import BackgroundResponses
from orchestrator.config import ServerConfig
from orchestrator.engine.catalogue import Catalogue
from orchestrator.metrics.engine_collector import EngineCollector
from orchestrator.metrics.request_metrics import RequestMetrics
from orchestrator.scheduler import Scheduler
from orchestrator.store import ResponseStore
from orchestrator.structured.checker import GrammarChecker


@dataclass
class AppState:
    config: ServerConfig
    catalogue: Catalogue
    scheduler: Scheduler
    registry: CollectorRegistry
    request_metrics: RequestMetrics
    engine_collector: EngineCollector
    grammar: GrammarChecker  # compiles every output constraint before its request is admitted
    keys: KeyRing
    limits: KeyLimiters  # per-key limiters
    usage: UsageMeter  # per-key usage
    audit: AuditLog
    initial_loads: asyncio.Task | None = None  # the scheduler's start, begun with the app
    store: ResponseStore | None = None  # kept responses (opened with the app; None when off or unavailable)
    background: BackgroundResponses = field(default_factory=BackgroundResponses)  # responses generating on their own


STATE = web.AppKey("inferno_state", AppState)
