# SPDX-License-Identifier: Apache-2.0
"""The LTP transport: move one round's float32 buffers between hosts,
tolerating loss, over the XDP dataplane.

A host's `Endpoint` (endpoint.py; made with an endpoint_config.py
`EndpointConfig`) pushes rounds (push.py: `Push`, paced,
loss-detecting re-sends, or ackclock.py: `ClockPush`, the ACK-clocked sender
at the NIC; options.py: which sender and the clock's knobs, per endpoint or
per push; sender.py: what an endpoint's pushes share, `Sender`: the socket,
and what past pushes learnt of each target) and receives them (receiver.py:
Early Close decides when a round ends, Bubble Filling gives every missing
chunk a value). The policies live beside them: early_close.py, bubble.py,
rate.py, layout.py (the round tokens that key a round's packets to the
job's secret, and the answers' signatures, are control/trust's);
lossdetect.py chooses what a sender sends next (RACK-style loss detection:
lost chunks first, backoff for a silent peer); results.py holds the peers
and what pushes and rounds report; fec.py erasure-codes a reliable round
(Reed-Solomon parity, so a receiver rebuilds what it lost); defer.py sends
an answer tolerantly (once; what some worker lacks is deferred a step by
every worker alike); straggler.py names whom a round waited for from the
NIC's arrival times; aggregate.py sums a round's rows into the server's
answer (float32, one fixed order, across threads, NaN and Inf contained),
on sumkernel.py's C kernel where the compiler builds it;
stream.py sends a step's answer part by part as its rounds are summed;
roundspace.py numbers server s's rounds r·S + s, so S servers' flows share
one endpoint (a sharded worker's one device); udpsock.py makes an
endpoint's socket, bound to its port (a shared device's ranks are told
apart by it: dataplane/xdp/mux.py); succession.py lets an endpoint take
another's place on its device in one update (a worker's room grown).

The public names load on first use, so importing a policy module alone
(e.g. early_close for a flag parser) does not load the dataplane.
"""
from __future__ import annotations

import importlib

_PUBLIC = {"Endpoint": "endpoint", "TransportError": "endpoint", "DeadPeerError": "endpoint",
           "EndpointConfig": "endpoint_config", "PushSpec": "options",
           "Peer": "results",
           "PushReport": "results", "RoundResult": "results",
           "EarlyCloseConfig": "early_close", "COMPLETE": "early_close",
           "DEADLINE": "early_close", "TIMEOUT": "early_close"}

__all__ = list(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
