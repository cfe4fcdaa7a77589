# SPDX-License-Identifier: Apache-2.0
"""A sampling profiler for every thread of a process (developer aid for the
benchmark jobs): a daemon thread reads `sys._current_frames()` every
`interval` seconds and counts each thread's innermost frames of this repo
and the library call under them; `report()` gives the most seen.

Unlike cProfile it sees every thread (the transport's receivers and
senders, the signer) and costs the process one short wake-up per sample.
A frame waiting in C (a socket call, a numpy kernel, a lock) shows as the
Python line that called it, which is what a breakdown needs."""
from __future__ import annotations

import collections
import sys
import threading
import time


class Sampler:
    def __init__(self, interval: float = 0.005, depth: int = 4):
        self.interval, self.depth = interval, depth
        self.leaf: collections.Counter = collections.Counter()
        self.stack: collections.Counter = collections.Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="stacksample")

    def start(self) -> Sampler:
        self._t.start()
        return self

    def _run(self) -> None:
        me = threading.get_ident()
        names = {}
        while not self._stop.wait(self.interval):
            self.samples += 1
            for tid, frame in sys._current_frames().items():
                if tid == me:
                    continue
                if tid not in names:
                    names = {t.ident: t.name for t in threading.enumerate()}
                thread = names.get(tid, "?").split("-")[0].split(" ")[0]
                chain = []
                f = frame
                while f is not None and len(chain) < self.depth:
                    co = f.f_code
                    chain.append(f"{co.co_filename.rsplit('/', 1)[-1]}:{co.co_name}:{f.f_lineno}")
                    f = f.f_back
                self.leaf[(thread, chain[0])] += 1
                self.stack[(thread, " < ".join(chain))] += 1

    def stop(self) -> None:
        self._stop.set()
        self._t.join()     # it wakes every `interval`: report() then reads still counts

    def report(self, top: int = 25) -> dict:
        """The most seen innermost frames and stacks, as seconds (samples x
        interval) per thread name."""
        def rows(c):
            return [{"thread": t, "where": w, "s": round(n * self.interval, 3)}
                    for (t, w), n in c.most_common(top)]
        return {"samples": self.samples, "interval_s": self.interval,
                "leaf": rows(self.leaf), "stack": rows(self.stack)}


def _demo() -> None:   # python3 scripts/stacksample.py: samples a busy loop
    s = Sampler().start()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        sum(range(1000))
    s.stop()
    print(s.report(3))


if __name__ == "__main__":
    _demo()
