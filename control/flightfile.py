# SPDX-License-Identifier: Apache-2.0
"""The flight recorder's file: the layout of a rank's `rank<R>.now` (an array
of int64 words the rank writes in place, control/torchapi/flight.py) and its
reader, for the launcher (control/launcher/hangs.py), which must not import
torch. Every word is little-endian int64; times are CLOCK_MONOTONIC ns.
"""
from __future__ import annotations

import struct

from .settings_table import TABLE

ENV_DIR = TABLE["flight_dir"].env     # LTP_FLIGHT_DIR: the job's flight folder
MAGIC = 0x4C54_5046_0001      # "LTPF", version 1
(W_MAGIC, W_PID, W_ROLE, W_INDEX, W_RANK, W_SEQ, W_PHASE, W_ROUND, W_SINCE, W_OPS, W_STEP,
 W_TICK, W_EVENTS, W_DUMPS) = range(14)
HEADER = 16            # words
PEERS = 256            # peer slots
RING = 256             # phase changes kept
RING_AT = HEADER + PEERS
WORDS = RING_AT + 4 * RING
SERVER, WORKER = 0, 1

# phases; the ones that wait on another rank are in WAITS
START, COMPUTE, BARRIER, PUSH, PULL, OPS, GATHER, SEND, END = range(9)
PHASES = ("start", "compute", "barrier", "push", "answer", "arrivals", "gather", "send", "end")
WAITS = frozenset((BARRIER, PUSH, PULL, OPS, GATHER))
OP_START = frozenset((BARRIER, OPS))     # a new op begins (its interval feeds the median)

NOW_REC = struct.Struct("<qqqqq")         # seq, phase, round, since, ops
EV_REC = struct.Struct("<qqqq")           # seq, phase, round, t


def read_now(path: str) -> dict | None:
    """A rank's .now file as a dict (None if it is not one): what the
    launcher reads, whatever state the rank's process is in."""
    try:
        with open(path, "rb") as f:
            b = f.read(WORDS * 8)
    except OSError:
        return None
    if len(b) < WORDS * 8 or struct.unpack_from("<q", b)[0] != MAGIC:
        return None
    h = struct.unpack_from(f"<{HEADER}q", b)
    peers = struct.unpack_from(f"<{PEERS}q", b, HEADER * 8)
    phase = h[W_PHASE]
    return {"pid": h[W_PID], "role": "server" if h[W_ROLE] == SERVER else "worker",
            "index": h[W_INDEX], "rank": h[W_RANK], "seq": h[W_SEQ],
            "phase": PHASES[phase] if 0 <= phase < len(PHASES) else str(phase),
            "waits": phase in WAITS, "round": h[W_ROUND], "since_ns": h[W_SINCE],
            "ops": h[W_OPS], "median_op_s": h[W_STEP] / 1e9 or None, "tick_ns": h[W_TICK],
            "dumps": h[W_DUMPS], "peers": {p: t for p, t in enumerate(peers) if t}}
