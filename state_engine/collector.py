"""Python's cyclic garbage collector around bursts of long-lived objects and around forks.

A restore builds a heap state at once (hundreds of thousands of dicts, lists and tuples) and a
Flink import tens of thousands of records. None of them is in a reference cycle, and reference
counting frees them as usual; but left to the cyclic collector, such a burst is walked by young
collections, promoted, and counted towards a full collection, which then walks every object of
the process (about 60 ms per 100,000 objects here, paid on the job's first records).

Freezes (``gc.freeze``) go through :func:`hold_frozen`, which nests: a snapshot writer's fork
holds one while its child shares the parent's pages, a worker process one for its lifetime over
what it inherited; nothing here unfreezes what another holder froze.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_holders = 0
_lock = threading.Lock()


def hold_frozen() -> None:
    """Keep every object tracked now out of the collector (``gc.freeze``) until the matching
    :func:`release_frozen`. Holds nest: the first freezes, the last release unfreezes, so a
    snapshot writer's fork inside a longer hold (a worker process's) ends nothing of it."""
    global _holders
    with _lock:
        if _holders == 0:
            gc.freeze()
        _holders += 1


def release_frozen() -> None:
    """End one :func:`hold_frozen`; the last one returns the objects to the collector."""
    global _holders
    with _lock:
        _holders -= 1
        if _holders == 0:
            gc.unfreeze()


@contextmanager
def collector_paused(*, keep: bool = False) -> Iterator[None]:
    """The cyclic collector off for the block, and back to how it was after it.

    ``keep``: the block's objects live on (a restored state). On the way out they go to the
    oldest generation as objects that survived would, but without a collection walking them and
    without counting towards the next full one (``gc.freeze`` then ``gc.unfreeze``). While a
    :func:`hold_frozen` is held they join its frozen objects instead (an unfreeze would end the
    hold), and leave with it. A freeze the user made (``gc.freeze`` outside this module) is not
    ended either: then the objects are left to the collector as usual.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if keep:
            with _lock:
                if _holders > 0:
                    gc.freeze()
                elif gc.get_freeze_count() == 0:
                    gc.freeze()
                    gc.unfreeze()
        if was_enabled:
            gc.enable()
