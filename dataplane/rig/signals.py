# SPDX-License-Identifier: Apache-2.0
"""Signals while a rig is built or removed: SIGINT and SIGTERM wait until
removal is done (`deferred_signals`), and SIGTERM unwinds the stack like
Ctrl-C does (`sigterm_as_exit`) so `finally` blocks and `with` exits remove
what was built. pyroute2 forks helper processes that inherit these handlers:
in a fork they exit at once instead of unwinding (and removing) the
parent's rig."""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while the body runs (teardown must finish), then
    raise KeyboardInterrupt / SystemExit if one came in."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    pid = os.getpid()

    def record(signum, frame):  # noqa: ARG001
        if os.getpid() != pid:       # a fork (pyroute2 forks helpers): just die
            os._exit(128 + signum)
        got.append(signum)

    old = {s: signal.signal(s, record) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if signal.SIGINT in got:
            raise KeyboardInterrupt
        if signal.SIGTERM in got:
            raise SystemExit(128 + signal.SIGTERM)


_OWNER_PID = [0]


def _sigterm_exits(signum, frame):  # noqa: ARG001
    # pyroute2 forks helper children that inherit this handler and get SIGTERM
    # when done: they must die quietly, not unwind the parent's copied stack
    # (which would run the rig's teardown in the child).
    if os.getpid() != _OWNER_PID[0]:
        os._exit(128 + signal.SIGTERM)
    raise SystemExit(128 + signal.SIGTERM)


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """Turn SIGTERM into SystemExit in the body so `finally`/__exit__ run
    (only when nobody else handles SIGTERM and we are on the main thread)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    _OWNER_PID[0] = os.getpid()
    signal.signal(signal.SIGTERM, _sigterm_exits)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
