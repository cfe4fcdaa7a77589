# SPDX-License-Identifier: Apache-2.0
"""Constants read from the BPF C headers, so each has one definition.

bpf/ltp_wire.h holds the wire format's #defines (magic, port, types, flags),
bpf/ltp_maps.h the map declarations and `enum ltp_counter`. Python reads the
names and numbers from there; the struct layouts are mirrored once as ctypes
(wire.LtpHdr, maps.*) and tests/test_wire.py proves they agree with the C.
"""
from __future__ import annotations

import functools
import re

from ... import BPF_DIR


@functools.cache
def _text(header: str) -> str:
    return (BPF_DIR / header).read_text()


@functools.cache
def defines(header: str) -> dict[str, int]:
    """`#define LTP_NAME <int>` lines of bpf/<header>."""
    pat = r"^#define\s+(LTP_\w+)\s+(0x[0-9a-fA-F]+|\d+)\b"
    return {m.group(1): int(m.group(2), 0) for m in re.finditer(pat, _text(header), re.M)}


def enum_members(header: str, enum: str, prefix: str) -> list[str]:
    """Members of `enum <enum>` in order, `prefix` stripped, lower case,
    without the closing <prefix>MAX."""
    body = re.search(rf"enum {enum} \{{(.*?)\}};", _text(header), re.S).group(1)
    return [m.lower() for m in re.findall(rf"{prefix}(\w+)", body) if m != "MAX"]


def map_names(header: str) -> list[str]:
    """Names of the maps bpf/<header> declares (BPF_ARRAY, BPF_F_TABLE,
    BPF_RINGBUF_OUTPUT, ...)."""
    text = _text(header)
    simple = re.finditer(r"^BPF_(?:PERCPU_)?(?:ARRAY|HASH|RINGBUF_OUTPUT)\((\w+)", text, re.M)
    tables = re.finditer(r"^BPF_F_TABLE\(\"\w+\",[^,]+,[^,]+,\s*(\w+)", text, re.M)
    found = sorted([(m.start(), m.group(1)) for m in simple] +
                   [(m.start(), m.group(1)) for m in tables])
    return [name for _, name in found]
