# SPDX-License-Identifier: Apache-2.0
"""Ending the child processes a benchmark or a launched training job started: every one, always."""
from __future__ import annotations

import subprocess
import time


def stop_all(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """SIGTERM each child still running, SIGKILL those left after `grace_s`
    (one deadline for all), reap every one and close its pipes.

    SIGTERM first: a training rank turns it into an unwind that detaches its
    XDP programs, which SIGKILL would leave attached until its namespace goes."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    end = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        for f in (p.stdin, p.stdout, p.stderr):
            if f:
                f.close()
