# SPDX-License-Identifier: Apache-2.0
"""Rate control: the receiver advertises each active sender's share.

Scheme (docs/transport.md): the parameter server knows the capacity C of its
bottleneck (configured, e.g. the rig's TBF rate or the NIC speed). When it
opens a round it writes the capacity to divide, u * C * boost (u = 0.98 leaves
headroom so the queue drains), into the round's bank; the XDP program divides
it among the flows not finished at that moment and puts the result in every
ACK. So a sender learns its rate one round-trip after it starts and again on
every ACK; when a flow finishes, the others' shares grow on their next ACK.
Senders pace to the advertised rate with a token bucket that holds at most a
few packets, so the aggregate stays near C however many workers push at once.
"""
from __future__ import annotations

import gc
import time

from ...dataplane.clib import set_timer_slack
from .layout import FRAME_OVERHEAD


class SharePolicy:
    """Receiver side: per-worker share of a known capacity.

    share = boost * utilization * C / n_active (share_kbps(1) is what the XDP
    program divides). `boost` (1 .. max_boost) is a slow feedback loop, fed
    about once a millisecond with the delivery rate (wire bytes) and the
    fraction of the chunks delivered in that interval that came as re-sends:
    - re-sends above `max_loss` (10%) of at least 32 chunks delivered: the
      senders overdrive the bottleneck's queue, so every share falls by 10%
      (the caller does not judge smaller samples: at a round's end the few
      chunks still arriving are all re-sends);
    - delivery below 97% of the target (some senders cannot reach their
      share, for instance because they are short of CPU): shares rise by 10%;
    - delivery above the target: shares fall back by 5%.
    Senders detect a loss within about a millisecond (lossdetect.LossDetector,
    RACK-style), so re-sends are a timely sign of a queue that overflows.
    """

    def __init__(self, capacity_bps: float, utilization: float = 0.98, min_bps: float = 1e6,
                 max_boost: float = 2.0, max_loss: float = 0.1):
        if capacity_bps <= 0:
            raise ValueError("capacity must be positive (bits per second)")
        if not 0 < utilization <= 1:
            raise ValueError("utilization must be in (0, 1]")
        self.capacity_bps = capacity_bps
        self.utilization = utilization
        self.min_bps = min_bps
        self.max_boost = max_boost
        self.max_loss = max_loss
        self.boost = 1.0

    def share_bps(self, n_active: int) -> float:
        return max(self.min_bps,
                   self.boost * self.utilization * self.capacity_bps / max(1, n_active))

    def observe(self, delivered_bps: float, resent_fraction: float = 0.0) -> bool:
        """Feed the last interval's delivery rate and the fraction of its
        chunks that were re-sends; True if the shares changed."""
        target = self.utilization * self.capacity_bps
        old = self.boost
        if resent_fraction > self.max_loss:
            self.boost = max(1.0, self.boost * 0.9)
        elif delivered_bps < 0.97 * target:
            self.boost = min(self.max_boost, self.boost * 1.1)
        elif delivered_bps > target:
            self.boost = max(1.0, self.boost * 0.95)
        return abs(self.boost - old) > 0.01 * old

    def share_kbps(self, n_active: int) -> int:
        return int(self.share_bps(n_active) / 1000)


class Pacer:
    """Sender side: a token bucket at `rate_bps`, measured in packets.

    Sleeping costs less CPU than spinning (one machine hosts many senders), so
    the pacer waits until `burst` packets are due (the fewest whose spacing
    covers `min_sleep_s`) and releases them together. A sleep that overshoots
    is made up from the bucket, which holds at most 2 * burst + 1 packets
    (tokens a short batch did not use go back to it): the average rate holds,
    and no sender ever bursts more than that.
    """

    def __init__(self, rate_bps: float, pkt_bytes: int = 1500, min_sleep_s: float = 0.0005,
                 max_burst: int = 4, full: bool = False):
        self.pkt_bytes, self.min_sleep_s, self.max_burst = pkt_bytes, min_sleep_s, max_burst
        self.rate_bps = 0.0
        self.set_rate(rate_bps)
        self.tokens = float(self.burst) if full else 1.0
        self.t_last = time.perf_counter()

    def set_rate(self, rate_bps: float) -> None:
        if rate_bps > 0 and rate_bps != self.rate_bps:
            self.rate_bps = float(rate_bps)
            self.gap = self.pkt_bytes * 8 / self.rate_bps
            self.burst = max(1, min(self.max_burst, int(self.min_sleep_s / self.gap + 0.5)))
            self.cap = 2 * self.burst + 1

    def refund(self, n: int) -> None:
        """Give back `n` packets taken but not sent."""
        self.tokens = min(self.cap, self.tokens + n)

    def take(self) -> int:
        """Block until packets may go; returns how many (1..burst + 2)."""
        while True:
            now = time.perf_counter()
            self.tokens = min(self.cap, self.tokens + (now - self.t_last) / self.gap)
            self.t_last = now
            if self.tokens >= self.burst:
                n = int(self.tokens)
                self.tokens -= n
                return n
            time.sleep((self.burst - self.tokens) * self.gap)


CREDIT_RTT_S = 200e-6     # the base round trip the default credit covers
CREDIT_BUFFER = 32 * 1024  # ... and the bottleneck buffer it assumes
RING_FRAMES = 256          # a receive ring: veth's (fixed), a NIC's smallest common default


def credit_window(capacity_bps: float, chunk_bytes: int, credit_bytes: float | None = None,
                  ring_frames: int | None = RING_FRAMES) -> int:
    """Packets all ACK-clocked flows into one receiver may keep in flight
    together: credit_bytes (the bottleneck's buffer plus one BDP) in full
    frames; by default one BDP at CREDIT_RTT_S plus CREDIT_BUFFER. Each
    active flow's credit is this divided by the active flows, at least 1.

    It is at most ring_frames (None or 0: no cap): where the receiving CPU,
    not the wire, is the bottleneck (a fast link, one flow) the queue builds
    in the receive ring, not in the switch buffer, and a credit larger than
    the ring only overflows it: one flow at 32 Gbit/s with a 4 MB buffer
    kept ~3,300 packets in flight against veth's 256-frame ring, and 43 % of
    its DATA were re-sends (docs/transport.md, "The credit's ring cap")."""
    if credit_bytes is None:
        credit_bytes = capacity_bps * CREDIT_RTT_S / 8 + CREDIT_BUFFER
    if credit_bytes <= 0:
        raise ValueError(f"credit must be positive (bytes), got {credit_bytes}")
    if ring_frames is not None and ring_frames < 0:
        raise ValueError(f"ring_frames must be >= 0 (0: no cap), got {ring_frames}")
    window = max(1, int(credit_bytes // (chunk_bytes + FRAME_OVERHEAD)))
    return min(window, ring_frames) if ring_frames else window


def quiet_gc() -> None:
    """Collect once, then freeze what is alive (gc.freeze): the objects of the
    set-up (torch, numpy, the model, the endpoint) are never scanned again.
    Without this, in a training PS a full collection walks all of them and
    stalls a round for up to 0.7 s, and the young ones cost ~0.3 ms each."""
    gc.collect()
    gc.freeze()


def fine_timer_slack() -> None:
    """Ask for 1 ns timer slack (default 50 us) so short sleeps end on time."""
    set_timer_slack(1)
