# SPDX-License-Identifier: Apache-2.0
"""A co-located trainer's server process (colocate.Child starts it:
`python -m ltpx.control.torchapi.childserver --parent PID`, the server
rank's LTP_* variables in its environment): the parent-death signal first,
then, the trainer still there, the server rank's init(), which serves and
exits with the job."""
from __future__ import annotations

import argparse
import os
import signal
import sys

from ...dataplane.clib.proc import set_parent_death_signal
from .job import init, serve_here


def main(argv: list[str] | None = None) -> None:
    """A co-located server's process (`Child`): parent-death signal first,
    then, the trainer still there, the server rank's init, which serves and
    exits."""
    ap = argparse.ArgumentParser(description="a co-located trainer's server (started by it)")
    ap.add_argument("--parent", type=int, required=True)
    a = ap.parse_args(argv)
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != a.parent:      # it died before the signal was set
        sys.exit(1)
    init(serve=False)
    code = serve_here()
    sys.stdout.flush()     # as backend.serve_and_exit: no interpreter teardown (torch's
    sys.stderr.flush()     # of a store whose host has gone can abort a finished process)
    os._exit(code)


if __name__ == "__main__":
    main()
