"""The collector's settings in a serving process (orchestrator/aio.py): what a worker freezes before its first
load stays frozen through its loads and releases, and an engine's garbage is still collected."""

import gc
import weakref

import pytest

from orchestrator import aio


@pytest.fixture
def collector():
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class _Node:
    pass


def test_settling_freezes_the_heap_and_raises_the_young_threshold(collector):
    aio.settle_heap()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold()[0] == aio.GC_YOUNG_THRESHOLD


def test_a_reclaim_collects_an_engines_cycles_and_keeps_the_imports_frozen(collector):
    aio.settle_heap()  # a worker before its first load: its imports
    frozen = gc.get_freeze_count()
    engine = _Node()
    engine.loop = engine  # an engine's object in a cycle, made after the freeze
    gone = weakref.ref(engine)
    del engine
    assert gone() is not None
    aio.reclaim_heap()  # after a release
    assert gone() is None
    assert gc.get_freeze_count() == frozen  # the imports were not unfrozen to be walked again
