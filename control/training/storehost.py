# SPDX-License-Identifier: Apache-2.0
"""`python -m ltpx.control.training.storehost TIMEOUT_S`: host a job's rendezvous store.

A TCPStore server on 127.0.0.1 (an ephemeral port) of the network namespace
it runs in; it prints {"port": N} and then serves until it is signalled.
RigJob forks it from the fork server in the PS namespace, so the launcher
itself never imports torch (1.2-1.5 s of CPU it would spend while the
ranks' imports run); without the fork server the launcher hosts the store
in-process.
"""
from __future__ import annotations

import json
import signal
import sys
from datetime import timedelta
import torch.distributed as dist


def main() -> None:
    timeout_s = float(sys.argv[1]) if len(sys.argv) > 1 else 300.0
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    print(json.dumps({"port": store.port}), flush=True)
    try:
        while True:     # until SIGTERM or SIGKILL (or the fork server's end)
            signal.pause()
    except KeyboardInterrupt:   # Ctrl-C reaches the whole process group: the launcher ends it
        pass


if __name__ == "__main__":
    main()
