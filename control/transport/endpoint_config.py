# SPDX-License-Identifier: Apache-2.0
"""What an `Endpoint` is made with besides its device, address, peers and size:
one frozen, checked object (`EndpointConfig`), decided before the endpoint is
made, so a caller that makes endpoints again (a link whose op grew) keeps one
config and changes a field with `dataclasses.replace`.
"""
from __future__ import annotations

import dataclasses

from ...dataplane.xdp import wire as W
from .bubble import STRATEGIES
from .early_close import EarlyCloseConfig
from .options import DEFAULTS, PushOptions

LIVENESS_S = 1.0   # seconds a heartbeat counts (liveness_s=; docs/transport.md "A hung receiver")
ROLES = (None, "ps", "worker")


@dataclasses.dataclass(frozen=True)
class EndpointConfig:
    """An endpoint's settings (Endpoint's docstring says what each does).

    ns: the network namespace of the device (None: this process's).
    mode: XDP attach mode, "native" or "skb". job: the job cookie.
    capacity_bps: the bottleneck's rate. chunk_bytes: payload bytes a chunk.
    port: the LTP UDP port (this endpoint's: its program's, and its socket's
    where it is free). shared: take a seat of the device's mux
    (dataplane/xdp/mux.py) instead of owning the device, so several
    endpoints of a host share one NIC, each on a port of its own; its
    answers must come by unicast (a group frame reaches one program).
    early_close, bubble_strategy: the receive
    policies. initial_rate_bps: a first push's rate (default: the capacity
    shared by the peers). publish: a registry record for `ltp status`;
    label: what it serves, as `ltp status` and `ltp flows` show it beside
    its role (a training job's: "rank 5", its place in the job).
    self_id, role, secret, sender, push_options, credit_bytes, liveness_s,
    verify_csum, force: as Endpoint documents them. banks, bank_stride: round
    r uses bank (r // bank_stride) % banks. Where S servers share the round
    space (roundspace.py: server s's rounds are r·S + s), a worker's endpoint
    has 2S banks (two of its own per server) and secret may be a list of
    the S servers' secrets, round r's tokens made from secret[r % S]; server
    s's own has 2 banks and bank_stride S."""

    ns: str | None = None
    mode: str = "native"
    job: int = 0
    capacity_bps: float = 1e9
    chunk_bytes: int = W.CHUNK_BYTES
    port: int = W.PORT
    early_close: EarlyCloseConfig | None = None
    bubble_strategy: str = "mean"
    initial_rate_bps: float | None = None
    publish: bool = True
    self_id: int | None = None
    role: str | None = None
    label: str = ""
    force: bool = False
    secret: bytes | None = dataclasses.field(default=None, repr=False)
    sender: str | None = None
    push_options: PushOptions | None = None
    credit_bytes: float | None = None
    liveness_s: float | None = LIVENESS_S
    verify_csum: bool | None = None
    banks: int = 2
    bank_stride: int = 1
    shared: bool = False

    def __post_init__(self):
        if not 1 <= self.port <= 65535:
            raise ValueError(f"port must be in 1..65535, got {self.port!r}")
        if self.role not in ROLES:
            raise ValueError(f"role must be ps or worker, got {self.role!r}")
        if self.bubble_strategy not in STRATEGIES:
            raise ValueError(f"unknown bubble strategy {self.bubble_strategy!r}")
        if not isinstance(self.banks, int) or self.banks < 2:
            raise ValueError(f"banks must be an integer >= 2, got {self.banks!r}")
        if isinstance(self.secret, list) and self.banks % len(self.secret):
            raise ValueError(f"a secret per server ({len(self.secret)}) needs banks a multiple "
                             f"of their number, got {self.banks}")
        if self.liveness_s is not None and not self.liveness_s >= 0:
            raise ValueError(f"liveness_s must be >= 0 seconds or None, got {self.liveness_s!r}")
        if self.sender is not None and self.push_options is not None and \
                self.push_options.sender != self.sender:
            raise ValueError(f"sender {self.sender!r} and push_options.sender "
                             f"{self.push_options.sender!r} differ: give one")

    @classmethod
    def of(cls, config: EndpointConfig | None, **fields) -> EndpointConfig:
        """config (default: every default) with `fields` set over it, checked."""
        base = config if config is not None else cls()
        return dataclasses.replace(base, **fields) if fields else base

    @property
    def options(self) -> PushOptions:
        """The pushes' options: push_options (or the defaults), the sender set."""
        options = self.push_options or DEFAULTS
        if self.sender is not None:
            options = dataclasses.replace(options, sender=self.sender)
        return options
