# SPDX-License-Identifier: Apache-2.0
"""The ACK clock's send side in the maps (bpf/ltp_maps.h: ltp_sendbuf,
ltp_sendorder and the clock fields of ltp_tx).

A clocked sender writes the round's payload and send order where its XDP
program reads them (`load`), starts each flow with the packets it primes
(`start`), and takes order positions from the tail to grow a window
(`take_tail`). Its XDP program hands out positions from the front with a
fetch-add on `next` and counts the ACKs it consumes (and the chunks only
a SACK named delivered); in flight is `added - consumed`. Every field has
one writer (the control plane or XDP), so nothing here needs an atomic
operation.
"""
from __future__ import annotations

import numpy as np

from .mapstructs import SO_CHUNK, SO_CRITICAL


def payload_sums(payload: np.ndarray, nchunks: int, chunk_bytes: int) -> np.ndarray:
    """Per chunk, the 16-bit ones' complement sum of its payload's native
    16-bit words (what the UDP checksum adds for it; a short last chunk is
    padded with zeros, which add nothing)."""
    pad = np.zeros(nchunks * chunk_bytes, dtype=np.uint8)
    pad[:payload.size] = payload
    s = pad.view(np.uint16).reshape(nchunks, -1).sum(axis=1, dtype=np.uint64)
    while (s >> 16).any():
        s = (s & 0xffff) + (s >> 16)
    return s.astype(np.uint32)


def load(maps, round_: int, payload: np.ndarray, order: list[int] | np.ndarray,
         critical: np.ndarray, chunk_bytes: int) -> int:
    """Write round_'s payload (uint8) and send order (chunk per position,
    critical ones flagged) into its bank; returns the bank. The bank's
    previous round must be over: its flows stop at their next ACK (`stop`)."""
    if maps.sendbuf is None:
        raise ValueError("these maps have no ltp_sendbuf (loaded by an older build)")
    b = maps.bank_index(round_)
    order = np.asarray(order, dtype=np.uint32)
    nch = order.size
    if nch > maps.geometry.max_chunks or payload.size > maps.sendbuf.shape[1]:
        raise ValueError(f"{nch} chunks exceed the send buffer ({maps.geometry.max_chunks})")
    if chunk_bytes != maps.geometry.chunk_bytes:
        raise ValueError(f"chunk size {chunk_bytes} is not the program's "
                         f"{maps.geometry.chunk_bytes}")
    maps.sendbuf[b, :payload.size] = payload
    so = maps.sendorder[b]
    crit = np.asarray(critical, dtype=bool)[order]
    so["chunk"][:nch] = (order & SO_CHUNK) | np.where(crit, SO_CRITICAL, 0).astype(np.uint32)
    so["csum"][:nch] = payload_sums(payload, nch, chunk_bytes)[order]
    return b


def start(maps, round_: int, slot: int, *, nchunks: int, last_len: int, flags: int,
          primed: int, rack: bool = False) -> None:
    """Hand round_'s flow toward `slot` to the clock: positions [primed,
    nchunks) are XDP's to send, the first `primed` the caller sends itself.
    rack: XDP also re-sends the chunks it sent and finds lost, before new
    ones (`xdp_owned`; the caller recovers the rest). Call
    after maps.tx_start (which resets the flow) and before the first DATA
    goes out."""
    t = maps.tx[maps.bank_index(round_), slot]
    t["rack"] = int(bool(rack)) if maps.sentat is not None else 0
    t["nchunks"], t["last_len"], t["flags"] = nchunks, last_len, flags
    t["tail"] = nchunks
    t["next"] = primed
    t["added"] = primed
    t["clock"] = 1


def stop(maps, round_: int, slot: int) -> None:
    """The flow sends no more: its ACKs are recorded and consumed."""
    t = maps.tx[maps.bank_index(round_), slot]
    t["clock"] = 0


def take_tail(maps, round_: int, slot: int, k: int) -> list[int]:
    """Take up to k positions from the tail (those the clock has not handed
    out) and count them in flight; returns the positions. A position the
    clock took at the same moment goes out twice: a duplicate, whose second
    ACK the clock consumes."""
    t = maps.tx[maps.bank_index(round_), slot]
    tail, nxt = int(t["tail"]), int(t["next"])
    k = max(0, min(k, tail - nxt))
    if not k:
        return []
    t["tail"] = tail - k
    t["added"] = int(t["added"]) + k
    return list(range(tail - k, tail))


def add_inflight(maps, round_: int, slot: int, k: int) -> None:
    """Count k more packets in flight (the caller sent them itself)."""
    t = maps.tx[maps.bank_index(round_), slot]
    t["added"] = int(t["added"]) + k


def xdp_owned(maps, round_: int, slot: int, nchunks: int) -> np.ndarray:
    """bool[nchunks]: chunks whose latest DATA the XDP program sent and whose
    recovery is its own (RACK in XDP); a live view would change under the
    caller, so this is a copy."""
    return maps.sentat[maps.bank_index(round_), slot, :nchunks] != 0


def take_over(maps, round_: int, slot: int, chunks) -> None:
    """The caller re-sends these chunks itself: XDP no longer judges them
    (its log entries of them are superseded)."""
    maps.sentat[maps.bank_index(round_), slot, chunks] = 0
