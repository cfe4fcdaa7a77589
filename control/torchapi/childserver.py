# SPDX-License-Identifier: Apache-2.0
"""A co-located trainer's server process (colocate.Child starts it:
`python -m ltpx.control.torchapi.childserver --parent PID`, the server
rank's LTP_* variables in its environment): the parent-death signal first,
then, the trainer still there, the server rank's init(), which serves and
exits with the job.

A trainer that dies while its server starts ends it at once (SIGTERM as
the parent-death signal until the job is up: init's store waits run no
Python handler). One that dies later leaves its server serving its slice
(ORPHAN as the parent-death signal, `orphaned`): the other servers and this one go on
without the dead worker, as with server ranks of their own (over TCP its
connection's end marks it gone, link_tcp.py), so the job goes on. Such
a server ends with the job, or once no other trainer beats (liveness.py;
at most a heartbeat's DEAD_S and a slice after the last one), or when the
store is gone; so it outlives its trainer only while the job it serves
runs."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from datetime import timedelta

from ...dataplane import netns
from ...dataplane.clib.proc import set_parent_death_signal
from ...errors import UsageError
from .coord import KEY
from .job import current, init, serve_here
from .liveness import SLICE_S, Watch

log = logging.getLogger("ltpx.torch.childserver")

ORPHAN = signal.SIGUSR2     # the parent-death signal: serve on (`orphaned`)
_watched = threading.Event()   # the watch started: a signal seen again is the same death


def main(argv: list[str] | None = None) -> None:
    """A co-located server's process (`Child`): parent-death signal first,
    then, the trainer still there, the server rank's init, which serves and
    exits."""
    ap = argparse.ArgumentParser(description="a co-located trainer's server (started by it)")
    ap.add_argument("--parent", type=int, required=True)
    a = ap.parse_args(argv)
    signal.signal(ORPHAN, orphaned)
    # Until the job is up the trainer's death ends this process at once
    # (SIGTERM, its default action): init's waits block in the store, where
    # no Python handler runs, so ORPHAN's `orphaned` would come only at the
    # wait's timeout (a server killed with its trainer mid-init lived on so).
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != a.parent:      # it died before the signal was set
        sys.exit(1)
    init(serve=False)
    set_parent_death_signal(ORPHAN)   # up: a trainer's death leaves it serving
    if os.getppid() != a.parent:      # it died in between
        orphaned()
    code = serve_here()
    sys.stdout.flush()     # as backend.serve_and_exit: no interpreter teardown (torch's
    sys.stderr.flush()     # of a store whose host has gone can abort a finished process)
    os._exit(code)


def orphaned(signum=None, frame=None) -> None:
    """The trainer died (ORPHAN, the parent-death signal once the job is
    up; before, SIGTERM ends the process). Before the job is up there is
    nothing to go on with: end as SIGTERM would. Else serve on, watched by
    `watch` (once: the signal was seen to come up to three times for one
    death)."""
    if _watched.is_set():
        return
    try:
        job = current()
    except UsageError:
        job = None
    if job is None or getattr(job, "coord", None) is None:
        os.kill(os.getpid(), signal.SIGTERM)
        return
    others = [job.s.servers + w for w in range(job.workers) if w != job.global_rank]
    log.warning("ltpx.torch: the trainer of co-located server %d died; the server serves its "
                "slice on while another trainer lives (ranks %s)", job.global_rank, others)
    _watched.set()
    threading.Thread(target=watch, args=(job, others), name="ltpx-orphan", daemon=True).start()


def watch(job, ranks: list[int]) -> None:
    """End this server (SIGTERM: it unwinds and detaches) once none of
    `ranks` beats, or the store is gone."""
    try:
        with netns.inside(job.s.store_netns):   # a connection of its own
            store = job.store.clone()
        store.set_timeout(timedelta(seconds=1))
        beats = Watch(store, KEY)
        while any(beats.alive(r) for r in ranks):
            time.sleep(SLICE_S)
        why = "no other trainer beats"
    except Exception as e:   # noqa: BLE001 - the store is gone: the job is over
        why = f"the store is gone ({e})"
    log.warning("ltpx.torch: co-located server %d ends: %s", job.global_rank, why)
    os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    main()
