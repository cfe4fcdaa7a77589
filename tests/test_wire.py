# SPDX-License-Identifier: Apache-2.0
"""The wire format and map structs agree between bpf/ and dataplane/."""
from __future__ import annotations

import ctypes

import pytest

from ltpx.dataplane.xdp import maps as M
from ltpx.dataplane.xdp import wire as W
from conftest import requires_bpf


def _layout(t):
    return ctypes.sizeof(t), [(name, getattr(t, name).offset) for name, *_ in t._fields_]


@pytest.fixture(scope="module")
def dp(small_geometry):
    from ltpx.dataplane.xdp.loader import Dataplane
    with Dataplane(small_geometry) as d:
        yield d


@pytest.mark.root
@requires_bpf
@pytest.mark.parametrize("table,mirror", [
    ("ltp_lasthdr", W.LtpHdr), ("ltp_cfg", M.Cfg), ("ltp_banks", M.Bank),
    ("ltp_progress", M.Progress), ("ltp_stats", M.SlotStats), ("ltp_tx", M.Tx),
    ("ltp_share", M.Share), ("ltp_slottok", M.SlotTok),
])
def test_c_and_python_structs_agree(dp, table, mirror):
    tbl = dp.table(table)
    leaf = getattr(tbl, "sLeaf", tbl.Leaf)  # ctypes bcc generated from the C definition
    assert _layout(leaf) == _layout(mirror)


@pytest.mark.root
@requires_bpf
def test_progress_dtype_matches_struct(dp):
    assert M.PROGRESS_DTYPE.itemsize == ctypes.sizeof(dp.table("ltp_progress").Leaf)
    assert [M.PROGRESS_DTYPE.fields[n][1] for n, *_ in M.Progress._fields_] == \
        [getattr(M.Progress, n).offset for n, *_ in M.Progress._fields_]


@pytest.mark.unit
def test_counter_names_come_from_the_header():
    assert M.COUNTERS[0] == "pass"
    assert {"malformed", "bad_magic", "bad_version", "foreign_job", "unknown_worker",
            "stale", "future", "late", "out_of_range", "dup"} <= set(M.COUNTERS)


@pytest.mark.unit
def test_scapy_layer_and_packer_build_the_same_bytes():
    fields = dict(type=W.T_DATA, flags=W.F_CRITICAL | W.F_LAST, worker=513, job=0xDEADBEEF,
                  round=70000, chunk=3, nchunks=9, state=0, rate=123456)
    layer = W.LTP(**fields, len=8) / (b"\x01" * 8)
    packed = W.pack_header(**fields, length=8) + b"\x01" * 8
    assert bytes(layer) == packed
    hdr = W.unpack_header(packed)
    assert (hdr.magic, hdr.version, hdr.worker, hdr.job, hdr.round, hdr.rate) == \
        (W.MAGIC, W.VERSION, 513, 0xDEADBEEF, 70000, 123456)
    # big-endian on the wire
    assert packed[:2] == W.MAGIC.to_bytes(2, "big")
    assert packed[8:12] == (0xDEADBEEF).to_bytes(4, "big")


@pytest.mark.unit
def test_scapy_fills_length_and_dissects():
    from scapy.layers.inet import IP, UDP
    pkt = IP(bytes(IP(dst="198.18.0.1") / UDP(sport=1234, dport=W.PORT) /
                   W.LTP(worker=2, chunk=5) / (b"\0" * 12)))
    assert pkt[W.LTP].len == 12 and pkt[W.LTP].chunk == 5


@pytest.mark.unit
def test_unpack_rejects_short_input():
    with pytest.raises(ValueError, match=f"{W.HDR_LEN} bytes"):
        W.unpack_header(b"\0" * 10)


@pytest.mark.root
@requires_bpf
def test_map_names_are_the_programs_maps(dp):
    """MAP_NAMES (read from bpf/ltp_maps.h) is every map the compiled program has."""
    assert sorted(M.MAP_NAMES) == sorted(k.decode() for k in dp.bpf.tables)
    assert len(set(M.MAP_NAMES)) == len(M.MAP_NAMES)


@pytest.mark.unit
def test_header_has_one_python_description():
    """The numpy record, the byte offsets and the scapy layer all follow LtpHdr."""
    names = [n for n, _ in W.LtpHdr._fields_]
    assert list(W.HDR_DTYPE.names) == names and W.HDR_DTYPE.itemsize == W.HDR_LEN
    assert [f.name for f in W.LTP.fields_desc] == names
    assert [f.sz for f in W.LTP.fields_desc] == [ctypes.sizeof(t) for _, t in W.LtpHdr._fields_]
    rec = W.unpack_header(W.pack_header(flags=W.F_RETX, chunk=7, length=4))
    raw = bytes(rec)
    assert int.from_bytes(raw[W.OFF["chunk"]:W.OFF["chunk"] + 4], "big") == 7
    assert raw[W.OFF["flags"] + 1] & W.F_RETX  # big-endian: the low byte is second
    arr = __import__("numpy").frombuffer(raw, dtype=W.HDR_DTYPE)
    assert int(arr["chunk"][0]) == 7 and int(arr["flags"][0]) == W.F_RETX


@pytest.mark.unit
def test_geometry_port_is_the_wire_port():
    assert M.Geometry().port == W.PORT == 7410


@pytest.mark.unit
@pytest.mark.parametrize("mtu", [576, 1500, 9000])
def test_a_chunk_is_what_one_frame_carries_in_whole_float64_pairs(mtu):
    """chunk_bytes_for(mtu): a frame of `mtu` holds the IPv4, UDP and LTP
    headers and the chunk, a multiple of 8 bytes, and no more room for 8;
    CHUNK_BYTES, the other defaults, fits a 1500-byte frame too."""
    c = W.chunk_bytes_for(mtu)
    assert c % 8 == 0 and W.IP_UDP_LTP + c <= mtu < W.IP_UDP_LTP + c + 8
    assert W.CHUNK_BYTES % 8 == 0 and W.IP_UDP_LTP + W.CHUNK_BYTES <= 1500
