# SPDX-License-Identifier: Apache-2.0
"""`ltp capture` and what it stands on: the capture ring of bpf/ltp_xdp.c
(struct mirrors, the ring read through mmap, the lease), pcap/pcapng files
read and written without scapy, the CLI's flags, a capture during incast
rounds on a rig (every frame the program counted, none dropped, kernel
timestamps in order), and the Wireshark dissector run by tshark on a capture
made here. Packet-level cases of the capture path (on/off, snapshot bytes,
verdict) are in test_xdp_packets.py."""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import WHY_NOT_BPF, requires_bpf
from ltp_cli import LTP, ltp
from ltpx.dataplane.xdp import pcap
from ltpx.dataplane.xdp import wire as W

ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "tools" / "wireshark" / "ltp.lua"
RIG = f"cap{os.getpid() % 100000}"


def _frames():
    """A DATA and an ACK frame (with every flag of each set somewhere) and a
    frame that is not LTP."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    e = Ether(src="02:4c:54:00:00:0a", dst="02:4c:54:00:00:01")
    data = (e / IP(src="198.18.0.10", dst="198.18.0.1") / UDP(sport=40000, dport=W.PORT)
            / W.LTP(type=W.T_DATA, flags=W.F_CRITICAL | W.F_LAST | W.F_RELIABLE | W.F_RETX
                    | W.F_GROUP, worker=513, job=0xDEADBEEF, round=70000, chunk=3, nchunks=9)
            / (b"\x01" * 16))
    ack = (e / IP(src="198.18.0.1", dst="198.18.0.10") / UDP(sport=W.PORT, dport=40000)
           / W.LTP(type=W.T_ACK, flags=W.F_DUP | W.F_CRITICAL, worker=513, job=0xDEADBEEF,
                   round=70000, chunk=3, nchunks=9, state=W.RS_CLOSED, rate=250_000, len=0))
    other = e / IP(src="198.18.0.10", dst="198.18.0.1") / UDP(sport=40000, dport=53) / b"dns"
    return [bytes(data), bytes(ack), bytes(other)]


# --------------------------------------------------------------------------- files

@pytest.mark.unit
@pytest.mark.parametrize("suffix", [".pcap", ".pcapng"])
def test_files_keep_time_bytes_direction_and_comment(tmp_path, suffix):
    path = str(tmp_path / f"x{suffix}")
    frames = _frames()
    w = pcap.Writer(path, snaplen=1500, ifname="ltp-ps")
    t0 = 1_790_000_000_123_456_789
    for i, f in enumerate(frames):
        w.write(t0 + i, f[:60] if i == 0 else f, len(f), "in" if i else "out",
                "ltp_xdp verdict XDP_TX" if i == 1 else None)
    w.close()
    got = list(pcap.read(path))
    assert [g.ts_ns for g in got] == [t0, t0 + 1, t0 + 2]          # nanoseconds kept
    assert [g.data for g in got] == [frames[0][:60], frames[1], frames[2]]
    assert [g.wire_len for g in got] == [len(f) for f in frames]
    if suffix == ".pcapng":
        assert [g.direction for g in got] == ["out", "in", "in"]
        assert [g.comment for g in got] == [None, "ltp_xdp verdict XDP_TX", None]


@pytest.mark.unit
def test_scapy_written_files_read_the_same(tmp_path):
    from scapy.layers.l2 import Ether
    from scapy.utils import PcapNgWriter, wrpcap
    pkts = [Ether(f) for f in _frames()]
    for i, p in enumerate(pkts):
        p.time = 1_700_000_000 + i / 4
    wrpcap(str(tmp_path / "a.pcap"), pkts)
    with PcapNgWriter(str(tmp_path / "a.pcapng")) as w:
        for p in pkts:
            w.write(p)
    for name in ("a.pcap", "a.pcapng"):
        got = list(pcap.read(str(tmp_path / name)))
        assert [g.data for g in got] == [bytes(p) for p in pkts]
        assert [g.ts_ns // 1000 for g in got] == [1_700_000_000_000_000 + i * 250_000
                                                  for i in range(3)]


def _boundaries(data: bytes, first: int, length_at) -> list[int]:
    """Offsets where each record or block ends (length_at(data, at): its length)."""
    ends, at = [], first
    while at < len(data):
        at += length_at(data, at)
        ends.append(at)
    return ends


@pytest.mark.unit
@pytest.mark.parametrize("suffix", [".pcap", ".pcapng"])
def test_a_file_cut_anywhere_reads_its_whole_blocks_and_says_where_it_ends(tmp_path, suffix):
    """Cut at every byte: the frames of the whole records or blocks before the
    cut, and a note naming the file and the offset of the block cut short
    (none where the cut falls between blocks). A cut inside the pcapng
    section header once raised struct.error."""
    whole = tmp_path / f"whole{suffix}"
    w = pcap.Writer(str(whole), snaplen=1500, ifname="ltp-ps")
    for i, f in enumerate(_frames()):
        w.write(1_790_000_000_000_000_000 + i, f, direction="in")
    w.close()
    data = whole.read_bytes()
    if suffix == ".pcap":
        ends = _boundaries(data, 24, lambda d, at: 16 + int.from_bytes(d[at + 8:at + 12], "little"))
        frame_ends = ends
    else:
        ends = _boundaries(data, 0, lambda d, at: int.from_bytes(d[at + 4:at + 8], "little"))
        frame_ends = ends[2:]                   # a section header, an interface, 3 packets
    assert len(frame_ends) == 3 and ends[-1] == len(data)
    cut = tmp_path / f"cut{suffix}"
    for n in range(ends[0] if suffix == ".pcapng" else 24, len(data) + 1):
        cut.write_bytes(data[:n])
        notes: list[str] = []
        got = list(pcap.read(str(cut), notes))
        assert len(got) == sum(1 for e in frame_ends if e <= n), n
        if n in ends or (suffix == ".pcap" and n == 24):
            assert notes == [], (n, notes)
        else:
            start = max([e for e in [0 if suffix == ".pcapng" else 24, *ends] if e <= n])
            assert len(notes) == 1 and f"{cut}: cut short at offset {start} " in notes[0], (n, notes)


@pytest.mark.unit
def test_a_pcapng_block_that_cannot_be_what_it_says_names_the_file_and_offset(tmp_path):
    """A block too short for its type (these raised struct.error), a length
    not a multiple of 4, a packet longer than its block: PcapError."""
    import struct
    shb = pcap._block(pcap.PCAPNG_SHB, struct.pack("<IHHq", pcap.BYTE_ORDER_MAGIC, 1, 0, -1))
    idb = pcap._block(pcap.PCAPNG_IDB, struct.pack("<HHI", 1, 0, 1500))
    at = len(shb) + len(idb)
    cases = {
        "epb12": struct.pack("<III", pcap.PCAPNG_EPB, 12, 12),
        "idb16": struct.pack("<IIII", pcap.PCAPNG_IDB, 16, 0, 16),
        "spb12": struct.pack("<III", pcap.PCAPNG_SPB, 12, 12),
        "odd": struct.pack("<IIHH", 0x99, 14, 0, 0) + struct.pack("<HI", 0, 14),
        "long_packet": pcap._block(pcap.PCAPNG_EPB, struct.pack("<IIIII", 0, 0, 0, 100, 100)
                                   + b"x" * 8),
    }
    for name, block in cases.items():
        path = tmp_path / f"{name}.pcapng"
        path.write_bytes(shb + idb + block)
        with pytest.raises(pcap.PcapError, match=f"{path}: corrupt pcapng block at offset {at} "):
            list(pcap.read(str(path)))
    short_shb = tmp_path / "shb.pcapng"
    short_shb.write_bytes(struct.pack("<III", pcap.PCAPNG_SHB, 12, pcap.BYTE_ORDER_MAGIC))
    with pytest.raises(pcap.PcapError, match="section header block of length 12"):
        list(pcap.read(str(short_shb)))


@pytest.mark.root
def test_capture_reads_a_cut_file_with_a_note_and_refuses_a_corrupt_one(tmp_path):
    path = tmp_path / "x.pcapng"
    w = pcap.Writer(str(path))
    for i in range(4):
        w.write(1_790_000_000_000_000_000 + i, _frames()[0], direction="in")
    w.close()
    data = path.read_bytes()
    path.write_bytes(data[:-5])
    p = ltp("capture", "-r", path)
    assert len(p.stdout.splitlines()) == 3 and "note: " in p.stderr and "cut short" in p.stderr
    assert "cut short at offset" in json.loads(ltp("capture", "-r", path, "-j").stderr
                                               .splitlines()[-1])["cut_short"]
    head = int.from_bytes(data[4:8], "little")          # the section header, then the interface
    head += int.from_bytes(data[head + 4:head + 8], "little")
    bad = tmp_path / "bad.pcapng"
    bad.write_bytes(data[:head] + (6).to_bytes(4, "little") + (12).to_bytes(4, "little") * 2)
    p = ltp("capture", "-r", bad, rc=1)
    assert "corrupt pcapng block at offset" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.root
def test_bad_files_are_one_line_errors(tmp_path):
    junk = tmp_path / "junk.pcap"
    junk.write_bytes(b"not a capture file at all")
    for path, word in ((junk, "not a pcap"), (tmp_path / "none.pcap", "no such file")):
        p = ltp("capture", "-r", path, rc=1)
        assert word in p.stderr and "Traceback" not in p.stderr
        assert word in json.loads(ltp("capture", "-r", path, "-j", rc=1).stdout)["error"]


@pytest.mark.root
def test_read_filters_and_json_summary(tmp_path):
    path = tmp_path / "x.pcapng"
    w = pcap.Writer(str(path))
    frames = _frames()
    for i in range(30):
        w.write(1_790_000_000_000_000_000 + i * 1000, frames[i % 3], direction="in",
                comment="ltp_xdp verdict XDP_DROP" if i % 3 == 1 else None)
    w.close()
    p = ltp("capture", "-r", path, "-j", "--worker", "513")
    rows = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(rows) == 20 and {r["worker"] for r in rows} == {513}
    assert {r.get("verdict") for r in rows if r["type"] == "ACK"} == {"XDP_DROP"}
    summary = json.loads(p.stderr.splitlines()[-1])
    assert (summary["packets"], summary["other"], summary["via"]) == (20, 10, "file")
    assert ltp("capture", "-r", path, "--worker", "7").stdout == ""
    assert "0 LTP packets, 10 other skipped, 20 filtered out" in \
        ltp("capture", "-r", path, "--round", "1").stderr


@pytest.mark.root
@pytest.mark.parametrize("argv,word", [
    (["-r", "x.pcap", "--snaplen", "10"], "--snaplen"),
    (["-r", "x.pcap", "--duration", "3"], "--duration"),
    (["-r", "x.pcap", "--tx"], "--tx"),
    (["-r", "x.pcap", "--via", "xdp"], "--via"),
    (["-r", "x.pcap", "--job", "seven"], "--job"),
    (["-r", "x.pcap", "--worker", "70000"], "--worker"),
    (["eth9", "--via", "socket", "--tx"], "--tx"),
    (["eth9", "--duration", "0"], "--duration"),
])
def test_bad_flags_are_usage_errors(argv, word):
    p = ltp("capture", *argv, rc=2)
    assert word in p.stderr


# --------------------------------------------------------------------------- the ring

@pytest.mark.root
@requires_bpf
def test_ring_structs_agree_with_the_c(small_geometry):
    from ltpx.dataplane.xdp import capring
    from ltpx.dataplane.xdp.loader import Dataplane
    with Dataplane(small_geometry) as dp:
        for table, mirror in (("ltp_capcfg", capring.CapCfg), ("ltp_capstat", capring.CapStats)):
            leaf = getattr(dp.table(table), "sLeaf", dp.table(table).Leaf)
            assert ctypes.sizeof(leaf) == ctypes.sizeof(mirror)
            assert [(n, getattr(leaf, n).offset) for n, *_ in leaf._fields_] == \
                [(n, getattr(mirror, n).offset) for n, *_ in mirror._fields_]
        rec = dp.table("ltp_capbuf").sLeaf
        offs = [getattr(rec, n).offset for n, *_ in rec._fields_]
        assert offs[-1] == capring.CAP_HDR_LEN == capring.REC.size
        assert ctypes.sizeof(rec) - capring.CAP_HDR_LEN == \
            capring.CaptureMaps.from_dataplane(dp).frame_max == \
            small_geometry.chunk_bytes + (14 + 20 + 8 + W.HDR_LEN + 7) // 8 * 8  # a whole frame


# --------------------------------------------------------------------------- on a rig

@pytest.fixture(scope="module")
def cluster():
    if WHY_NOT_BPF:
        pytest.skip(WHY_NOT_BPF)
    from ltpx.control.bench.cluster import LtpCluster
    from ltpx.dataplane.rig.star import Rig, RigConfig
    with Rig(RigConfig(name=RIG, workers=4)) as rig, LtpCluster(rig, 16384) as c:
        yield c


def _start_capture(rig, *extra):
    p = subprocess.Popen([LTP, "capture", rig.ps.ifname, "--netns", rig.ps.netns, "-j", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    assert "capturing at ltp_xdp" in line, line + p.stderr.read()
    return p


def _stop(p) -> tuple[str, dict]:
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    return out, json.loads(err.splitlines()[-1])


def _ingress(maps) -> int:
    from ltpx.dataplane.xdp.capring import NOT_INGRESS
    return sum(v for k, v in maps.counters().items() if k not in NOT_INGRESS)


@pytest.mark.rig
@requires_bpf
def test_capture_during_rounds_gets_every_frame_in_order(cluster, tmp_path):
    """The goal of issue 18 on a small rig: during incast rounds, the ring
    capture on the PS writes exactly the frames ltp_xdp counted, drops none,
    with kernel timestamps that never go back, each with its verdict."""
    rig, maps, path = cluster.rig, cluster.ps.maps, tmp_path / "ps.pcapng"
    p = _start_capture(rig, "-w", str(path))
    try:
        before = _ingress(maps)
        for r in (1, 2, 3):
            cluster.run_round(r, 16384)
        seen = _ingress(maps) - before
    finally:
        _, summary = _stop(p)
    assert seen >= 3 * 4 * 46                       # 64 KiB per worker: 46 chunks, 3 rounds
    assert (summary["via"], summary["dropped"], summary["lease_lapsed"]) == ("xdp", 0, 0)
    assert summary["packets"] == summary["program_frames"] == seen
    frames = list(pcap.read(str(path)))
    assert len(frames) == seen
    ts = [f.ts_ns for f in frames]
    assert ts == sorted(ts) and summary["out_of_order"] == 0
    assert abs(ts[-1] / 1e9 - time.time()) < 60                # wall clock, from the kernel's
    assert {f.direction for f in frames} == {"in"}
    verdicts = {f.comment for f in frames}
    assert "ltp_xdp verdict XDP_TX" in verdicts and verdicts <= {
        "ltp_xdp verdict XDP_TX", "ltp_xdp verdict XDP_DROP"}
    from ltpx.dataplane.xdp.capture import decode
    rows = [decode(f.data, wire_len=f.wire_len) for f in frames]
    assert {r["type"] for r in rows} == {"DATA"} and {r["round"] for r in rows} == {1, 2, 3}
    # whole frames by default, up to the largest LTP frame of the program's
    # geometry; longer ones (a GSO batch that generic XDP sees unsegmented)
    # are cut there, and keep their length on the wire
    most = max(len(f.data) for f in frames)
    assert most == cluster.chunk_bytes + (42 + W.HDR_LEN + 7) // 8 * 8 or \
        all(len(f.data) == f.wire_len for f in frames)
    assert all(len(f.data) == min(f.wire_len, most) for f in frames)


@pytest.mark.rig
@requires_bpf
def test_filters_snaplen_tx_and_one_capture_per_program(cluster, tmp_path):
    rig, path = cluster.rig, tmp_path / "w1.pcap"
    p = _start_capture(rig, "--worker", str(cluster.ids[1]), "--round", "5", "--tx",
                       "--snaplen", "100", "-w", str(path), "--print")
    try:
        second = ltp("capture", rig.ps.ifname, "--netns", rig.ps.netns, "-c", "1", rc=1)
        assert "a capture is running" in second.stderr and str(p.pid) in second.stderr
        cluster.run_round(4, 16384)
        cluster.run_round(5, 16384)
    finally:
        out, summary = _stop(p)
    rows = [json.loads(x) for x in out.splitlines()]
    data = [r for r in rows if r["dir"] == "in"]
    acks = [r for r in rows if r["dir"] == "out"]
    assert data and {(r["type"], r["worker"], r["round"]) for r in data} == \
        {("DATA", cluster.ids[1], 5)}
    assert cluster.chunk_bytes + 42 + W.HDR_LEN in {r["wire_len"] for r in data} and \
        summary["dropped"] == 0
    frames = list(pcap.read(str(path)))                 # --print: written and shown
    assert len(frames) == len(rows) == summary["packets"]
    assert all(len(f.data) == min(100, f.wire_len) for f in frames)
    # each DATA the program answered with XDP_TX has its ACK right after it
    assert len(acks) == sum(r["verdict"] == "XDP_TX" for r in data)
    assert {(r["type"], r["verdict"], r["src"]) for r in acks} == {("ACK", "XDP_TX", rig.ps.ip)}
    # the lease is gone with the capture: the next one starts at once
    assert ltp("capture", rig.ps.ifname, "--netns", rig.ps.netns, "--duration", "0.2").stderr


@pytest.mark.rig
@requires_bpf
def test_socket_fallback_where_the_program_is_not_ours(cluster):
    """The switch's port toward the PS carries the rig's xdp_pass, not
    ltp_xdp: --via xdp refuses it, auto captures there with a socket (DATA
    leaving toward the PS, its ACKs coming back), stamped by the kernel."""
    rig = cluster.rig
    port, ns = rig.ps.port, rig.switch_ns
    p = ltp("capture", port, "--netns", ns, "--duration", "0.3", "--via", "xdp", rc=1)
    assert "not ltp_xdp" in p.stderr and "--via socket" in p.stderr
    cap = subprocess.Popen([LTP, "capture", port, "--netns", ns, "-j", "--round", "6"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "AF_PACKET" in cap.stderr.readline()
        assert "listening on" in cap.stderr.readline()
        t0 = time.time()
        cluster.run_round(6, 16384)
    finally:
        out, summary = _stop(cap)
    rows = [json.loads(x) for x in out.splitlines()]
    assert summary["via"] == "socket" and "dropped_kernel" in summary
    assert {(r["dir"], r["type"]) for r in rows} == {("out", "DATA"), ("in", "ACK")}
    assert all(t0 - 1 < r["time"] < time.time() for r in rows)
    assert {r["round"] for r in rows} == {6}


# --------------------------------------------------------------------------- Wireshark

TSHARK = shutil.which("tshark")


@pytest.mark.unit
@pytest.mark.skipif(TSHARK is None, reason="needs tshark (scripts/setup.sh installs it)")
def test_tshark_decodes_every_field_of_data_and_ack(tmp_path):
    path = str(tmp_path / "ltp.pcap")
    w = pcap.Writer(path)
    for i, f in enumerate(_frames()):
        w.write(1_790_000_000_000_000_000 + i, f)
    w.close()
    fields = [n for n, _ in W.LtpHdr._fields_]
    cmd = [TSHARK, "-X", f"lua_script:{LUA}", "-r", path, "-T", "fields", "-E", "separator=|"]
    for n in fields:
        cmd += ["-e", f"ltpx.{n}"]
    for n in W.FLAG_NAMES.values():
        cmd += ["-e", f"ltpx.flags.{n}"]
    res = subprocess.run(cmd + ["-e", "ltpx.payload_len"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 3 and lines[2].strip("|") == ""          # the DNS frame is not LTP
    got = [dict(zip(fields + [f"flag.{n}" for n in W.FLAG_NAMES.values()] + ["payload"],
                    ln.split("|"))) for ln in lines[:2]]
    for row, frame in zip(got, _frames()):
        h = W.unpack_header(frame[42:])
        for n in fields:
            assert int(row[n], 0) == getattr(h, n), (n, row)
        for bit, n in W.FLAG_NAMES.items():
            assert row[f"flag.{n}"] in ("1", "True") if h.flags & bit else \
                row[f"flag.{n}"] in ("0", "False"), (n, row)
        assert int(row["payload"]) == len(frame) - 42 - W.HDR_LEN
    detail = subprocess.run([TSHARK, "-X", f"lua_script:{LUA}", "-r", path, "-V"],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "HOME": str(tmp_path)}).stdout
    assert "LTP (ltpx), DATA" in detail and "LTP (ltpx), ACK" in detail
    assert "Receiver state: closed (2)" in detail


@pytest.mark.unit
def test_dissector_fields_follow_the_header_description():
    """The .lua names every LtpHdr field, in order, with its size, and every
    flag, type and state of the C header with its value."""
    import re
    src = LUA.read_text()
    decl = re.findall(r'^\s*\{"(\w+)",\s*(\d),', src, re.M)
    assert decl == [(n, str(ctypes.sizeof(t))) for n, t in W.LtpHdr._fields_]
    for bit, name in W.FLAG_NAMES.items():
        assert re.search(rf'\{{"{name}",\s*0x{bit:04x},', src), name
    assert re.search(rf"PORT\s*=\s*{W.PORT}\b", src) and re.search(
        rf"MAGIC\s*=\s*0x{W.MAGIC:04x}\b", src, re.I)
    for value, name in ((W.T_DATA, "DATA"), (W.T_ACK, "ACK")):
        assert re.search(rf'\[{value}\]\s*=\s*"{name}"', src)
    for value, name in ((W.RS_OPEN, "open"), (W.RS_CLOSED, "closed")):
        assert re.search(rf'\[{value}\]\s*=\s*"{name}"', src)
