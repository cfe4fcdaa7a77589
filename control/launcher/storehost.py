# SPDX-License-Identifier: Apache-2.0
"""`python -m ltpx.control.launcher.storehost TIMEOUT_S`: host a job's rendezvous store.

A TCPStore server on 127.0.0.1 (an ephemeral port) of the network namespace
it runs in; it prints {"port": N} and then serves until it is signalled.
Given a host name, torch's TCPStore listens on every interface (`::`)
whatever the name; `loopback_store` binds the socket to 127.0.0.1 itself
and hands it over (`master_listen_fd`), so only that namespace reaches it.
RigJob forks it from the fork server in the PS namespace, so the launcher
itself never imports torch (1.2-1.5 s of CPU it would spend while the
ranks' imports run); without the fork server the launcher hosts the store
in-process.
"""
from __future__ import annotations

import json
import signal
import socket
import sys
from datetime import timedelta
import torch.distributed as dist


def loopback_store(timeout_s: float):
    """A TCPStore server listening on 127.0.0.1 only, at an ephemeral port."""
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        ls.bind(("127.0.0.1", 0))
        ls.listen(512)
        store = dist.TCPStore("127.0.0.1", ls.getsockname()[1], None, True,
                              timedelta(seconds=timeout_s), wait_for_workers=False,
                              master_listen_fd=ls.fileno())
    except BaseException:
        ls.close()
        raise
    ls.detach()      # the store owns the socket now, and closes it when it goes
    return store


def main() -> None:
    timeout_s = float(sys.argv[1]) if len(sys.argv) > 1 else 300.0
    store = loopback_store(timeout_s)
    print(json.dumps({"port": store.port}), flush=True)
    try:
        while True:     # until SIGTERM or SIGKILL (or the fork server's end)
            signal.pause()
    except KeyboardInterrupt:   # Ctrl-C reaches the whole process group: the launcher ends it
        pass


if __name__ == "__main__":
    main()
