# SPDX-License-Identifier: Apache-2.0
"""What the server and the workers exchange rounds through, whatever the transport.

Two transports give the op loops (server.py, exchange.py) the same calls:

  server:  ensure(n)          room for rounds of n elements (LTP: the endpoint's size)
           open(r, n, ws)     make uplink round r receivable (LTP; TCP has nothing to open)
           gather(r, n, ws)   -> Gathered: one row per worker in ws
           send(d, buf)       the answer to every worker (LTP: reliable class)
  worker:  ensure(n), expect(d, n)   be ready for the answer d
           push(r, buf)       this worker's piece for uplink round r
           pull(d, out)       the answer d, copied into `out`

link_ltp.py (XDP endpoints: Early Close and Bubble Filling on the uplink,
the reliable class with an optional group address on the downlink) and
link_tcp.py (one connection per worker, every byte delivered) implement them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...dataplane.xdp.headers import defines

# IPv4 + UDP + LTP header bytes per datagram (the header's length from bpf/ltp_wire.h)
IP_UDP_LTP = 20 + 8 + defines("ltp_wire.h")["LTP_HDR_LEN"]


def chunk_bytes_for(mtu: int) -> int:
    """The largest LTP chunk one frame of `mtu` carries, in whole float64 pairs
    (control/bench/cluster.py sizes its chunks alike, so a rig round looks the same)."""
    return (mtu - IP_UDP_LTP) // 8 * 8


@dataclass
class Gathered:
    """One uplink round as the server sees it."""

    round: int
    values: np.ndarray            # float32 [k, n]: per-worker rows (holes filled)
    workers: list[int]
    delivered: np.ndarray         # int [k]: chunks that arrived per worker
    chunks: int                   # chunks per worker
    filled: np.ndarray            # int [k]: chunks Bubble Filling wrote per worker
    reason: str = "complete"      # complete | early | deadline | timeout (LTP)
    chunk_elems: int = 0
    masks: np.ndarray | None = None   # bool [k, chunks] (LTP)
    duration_s: float = 0.0

    @property
    def missing(self) -> list[int]:
        """Workers none of whose chunks arrived (their whole row was filled)."""
        return [w for w, d in zip(self.workers, self.delivered) if d == 0]

    @property
    def early_closed(self) -> bool:
        return self.reason in ("early", "deadline")
