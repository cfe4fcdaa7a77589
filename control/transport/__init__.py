"""The LTP transport: move one round's float32 buffers between hosts,
tolerating loss, over the XDP dataplane.

A host's `Endpoint` pushes rounds (sender.py: paced, loss-detecting
re-sends) and receives them (receiver.py: Early Close decides when a round
ends, Bubble Filling gives every missing chunk a value). The policies live
beside them: early_close.py, bubble.py, rate.py, layout.py.

The public names load on first use, so importing a policy module alone
(e.g. early_close for a flag parser) does not load the dataplane.
"""
from __future__ import annotations

import importlib

_PUBLIC = {"Endpoint": "endpoint", "TransportError": "endpoint", "DeadPeerError": "endpoint",
           "Peer": "results",
           "PushReport": "results", "RoundResult": "results",
           "EarlyCloseConfig": "early_close", "COMPLETE": "early_close",
           "DEADLINE": "early_close", "TIMEOUT": "early_close"}

__all__ = list(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
