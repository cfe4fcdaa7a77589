# SPDX-License-Identifier: Apache-2.0
"""One daemon thread that runs calls in the order they are given.

The optimizer's communication thread (a bucket is pushed while backward
goes on) and each server shard's thread (shards.py) are one of these:
submit(fn, *args) queues a call, drain() returns once every call so far is
done and raises the first error again in the caller's thread (later calls
are skipped once one failed), close() ends the thread after the queue and
joins it.
"""
from __future__ import annotations

import queue
import threading


class CallThread:
    def __init__(self, name: str):
        self.q: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.loop, name=name, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while True:
            fn = self.q.get()
            try:
                if fn is None:
                    return
                if self.error is None:
                    fn()
            except BaseException as e:   # handed to the caller's thread by drain()
                self.error = e
            finally:
                self.q.task_done()

    def submit(self, fn, *args) -> None:
        self.q.put((lambda: fn(*args)) if args else fn)

    def drain(self) -> None:
        self.q.join()
        if self.error is not None:
            e, self.error = self.error, None
            raise e

    def close(self, wait_s: float = 10.0) -> None:
        """End the thread after what is queued, and wait for it: a daemon
        thread still running at interpreter exit is ended by the interpreter
        wherever it is, and inside torch code (freeing a tensor) that aborts
        the process ("terminate called without an active exception")."""
        self.q.put(None)
        if self.thread is not threading.current_thread():
            self.thread.join(wait_s)
