"""
The garbage collector, set for a server whose one thread must answer
within milliseconds.  CPython's cyclic collector stops the reactor for as
long as it takes to scan what it tracks: with default settings a full
collection ran every few hundred thousand allocations and, over the
modules, retained messages and sessions of a running gateway, took tens
of milliseconds, which every client waiting on the reactor felt
(the performance page has the figures).  Young collections must stay short too: each
scans every object allocated since the last.
"""

import gc

from twisted.logger import Logger

log = Logger()

# Allocations between young collections (CPython: 700): few enough that
# one stays short (beside the hostile neighbours: 0.5 ms on average, at
# most 1.7; at 50,000 they took 3-6 ms); young collections between middle
# ones; and middle between full ones, so that a full one comes every 10
# million allocations, as before.
THRESHOLDS = (10_000, 20, 50)


def tune():
    """
    Once start-up is done: what exists now (modules, the restored store)
    lives as long as the process, so it is frozen out of every later
    collection, and young collections run less often.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
    log.debug(
        "garbage collector: {frozen} start-up objects frozen, thresholds {thresholds}",
        frozen=gc.get_freeze_count(),
        thresholds=THRESHOLDS,
    )
