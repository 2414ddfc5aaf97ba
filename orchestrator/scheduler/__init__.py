"""Scheduling: admission, placement of models on devices, the memory ledger, recovery from crashes.

This file is the package's public view, the only names the HTTP side (api/, metrics/, access/, server.py) imports
from it (tests/unit/test_import_cycles.py checks): the `Scheduler` with its read-only `ModelView`, the snapshots
it gives for metrics and the admin API, and the few settings types a request carries. The rest of the package
(the model table, queues, the ledger, placement) is the scheduler's own.
"""

from orchestrator.scheduler.fairness import Tenant
from orchestrator.scheduler.observe import DeviceMemory, KeptSnapshot, ModelSnapshot
from orchestrator.scheduler.scheduler import FAREWELL_S, LedgerState, ModelView, Scheduler
from orchestrator.scheduler.settings import Priority, SettingsError, request_priority
from orchestrator.scheduler.sim_device import MixedEngines

__all__ = ["FAREWELL_S", "DeviceMemory", "KeptSnapshot", "LedgerState", "MixedEngines", "ModelSnapshot", "ModelView", "Priority",
           "Scheduler", "SettingsError", "Tenant", "request_priority"]
