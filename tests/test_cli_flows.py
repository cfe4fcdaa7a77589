# SPDX-License-Identifier: Apache-2.0
"""`ltp flows/top/capture`: the real CLI as subprocesses (load, unload and
status are in test_cli_ops.py; the shared parts in ltp_cli.py).

One rig (PS + 2 workers) serves the module. The PS program is loaded by
`ltp load`; this process plays the control plane on its pins (open/close a
round, record its outcome) and sends LTP DATA from the workers with plain UDP
sockets, with the rig's loss injector dropping some. Tests run in file order
(the counters `flows` checks start at zero).
"""
from __future__ import annotations

import json
import re
import os
import pty
import select
import subprocess
import time

import numpy as np
import pytest

from conftest import requires_bpf
from ltp_cli import (CHUNK, JOB, LAST, LTP, NCH, ltp, ltp_json, rig_fixtures,
                     width)
from ltpx.dataplane.xdp import wire as W

RIG = f"flw{os.getpid() % 100000}"


# --------------------------------------------------------------------------- no rig needed

def _pcap_packets():
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    e = Ether(src="02:4c:54:00:00:0a", dst="02:4c:54:00:00:01")
    data = (e / IP(src="198.18.0.10", dst="198.18.0.1") / UDP(sport=40000, dport=W.PORT)
            / W.LTP(type=W.T_DATA, flags=W.F_CRITICAL | W.F_LAST, worker=3, job=JOB, round=9,
                    chunk=2, nchunks=4) / (b"\x01" * 16))
    ack = (e / IP(src="198.18.0.1", dst="198.18.0.10") / UDP(sport=W.PORT, dport=40000)
           / W.LTP(type=W.T_ACK, flags=W.F_DUP, worker=3, job=JOB, round=9, chunk=2, nchunks=4,
                   state=W.RS_CLOSED, rate=250_000))
    other = e / IP(src="198.18.0.10", dst="198.18.0.1") / UDP(sport=40000, dport=53) / b"dns"
    short = (e / IP(src="198.18.0.10", dst="198.18.0.1") / UDP(sport=40000, dport=W.PORT)
             / b"LT\x01")
    return [data, ack, other, short]


@pytest.mark.root
def test_capture_reads_a_pcap(tmp_path):
    from scapy.utils import wrpcap
    f = tmp_path / "ltp.pcap"
    wrpcap(str(f), _pcap_packets())
    p = ltp("capture", "-r", f, "-j")
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert [r["type"] for r in rows] == ["DATA", "ACK", "?"]
    d, a, s = rows
    assert (d["worker"], d["job"], d["round"], d["chunk"], d["nchunks"], d["len"],
            d["payload_bytes"], d["flags"]) == (3, JOB, 9, 2, 4, 16, 16, ["critical", "last"])
    assert (a["flags"], a["state"], a["rate_kbps"], a["len"], a["sport"]) == \
        (["dup"], "closed", 250_000, 0, W.PORT)
    assert s["bad"].startswith("short")
    summary = json.loads(p.stderr.splitlines()[-1])      # -j: the summary is JSON too
    assert (summary["packets"], summary["other"], summary["dropped"]) == (3, 1, 0)
    assert "3 LTP packets, 1 other skipped" in ltp("capture", "-r", f).stderr

    text = ltp("capture", "-r", f).stdout.splitlines()
    assert "DATA w=3 r=9 c=2/4 len=16 flags=critical,last job=0x17" in text[0]
    assert "ACK w=3 r=9 c=2/4 len=0 flags=dup job=0x17 state=closed rate=250000k" in text[1]

    out = tmp_path / "copy.pcap"
    assert ltp("capture", "-r", f, "-c", "2", "-w", out).stdout == ""    # -w: no lines
    assert len(ltp("capture", "-r", f, "-c", "2", "-w", out, "--print").stdout.splitlines()) == 2
    assert [r["type"] for r in json.loads(ltp("capture", "-r", out, "-p").stdout)] == \
        ["DATA", "ACK"]
    assert json.loads(ltp("capture", "-r", tmp_path / "none.pcap", "-j", rc=1).stdout)["error"]


# --------------------------------------------------------------------------- on a rig

rig, loaded = rig_fixtures(RIG)


@pytest.mark.root
@requires_bpf
def test_counters_of_an_older_build_read_as_far_as_they_go():
    """A program pinned by an older build has fewer counter classes (its
    ltp_counters map is shorter): reading it gives the classes it has, in
    order, instead of failing on the first it lacks (what `ltp flows`, top
    and the exporter read from the pins)."""
    import ctypes
    import os as _os

    from ltpx.dataplane.clib import bpfsys
    from ltpx.dataplane.xdp.maps import COUNTERS, FdMap, read_counters
    percpu_array = 6     # BPF_MAP_TYPE_PERCPU_ARRAY
    for entries in (len(COUNTERS), len(COUNTERS) - 1, 3):
        fd = bpfsys.map_create(percpu_array, "ltp_counters", 4, 8, entries)
        try:
            got = read_counters(FdMap(fd, ctypes.c_uint64, percpu=True), COUNTERS)
        finally:
            _os.close(fd)
        assert list(got) == COUNTERS[:entries]
        assert set(got.values()) == {0}


@pytest.mark.root
@requires_bpf
def test_round_stats_struct_matches_the_c_definition(small_geometry):
    import ctypes

    from ltpx.dataplane.xdp import maps as M
    from ltpx.dataplane.xdp.loader import MAP_NAMES, Dataplane
    assert "ltp_rounds" in MAP_NAMES
    with Dataplane(small_geometry) as dp:
        leaf = dp.table("ltp_rounds").Leaf
        layout = [(n, getattr(leaf, n).offset) for n, *_ in leaf._fields_]
        assert layout == [(n, getattr(M.RoundStats, n).offset) for n, *_ in M.RoundStats._fields_]
        assert ctypes.sizeof(leaf) == ctypes.sizeof(M.RoundStats)
        m = dp.maps()
        m.record_round(1, "early", 50, 7, round_=3, duration_s=0.05, lateness_s=-0.002)
        m.record_round(1, "complete", 57, 0, round_=4, duration_s=0.0001, straggler=True,
                       lateness_s=0.03)
        m.record_round(1, "timeout", 0, 57, round_=5, duration_s=30.0, straggler=True,
                       lateness_s=9.0)
        m.record_round(1, "deadline", 1, 56, round_=6, budget=0.25)   # no time: no histogram
        hist = [0] * M.ROUND_TIME_BUCKETS
        hist[0] = hist[9] = hist[-1] = 1      # 0.1 ms <= 100 us; 50 ms <= 51.2 ms; 30 s > 26.2 s
        assert M.ROUND_TIME_BOUNDS_S[0] == 0.0001 and M.ROUND_TIME_BOUNDS_S[9] == 0.0512
        late = [0] * (len(M.LATE_BOUNDS_S) + 1)   # early: bucket 0; 30 ms <= 51.2 ms; 9 s > 1.6 s
        late[0] = late[9] = late[-1] = 1
        assert m.round_stats(1) == {"complete": 1, "early": 1, "deadline": 1, "timeout": 1,
                                    "delivered": 108, "filled": 120, "last_round": 6,
                                    "last_delivered": 1, "last_filled": 56,
                                    "last_budget_ppm": 250_000,
                                    "time_us": 30_050_100, "time_hist": hist,
                                    "straggler": 2, "late_hist": late}
        with pytest.raises(ValueError, match="reason"):
            m.record_round(0, "lost", 1, 1)
        with pytest.raises(ValueError, match="budget"):
            m.record_round(0, "early", 1, 1, budget=1.5)
        assert m.round_stats(0)["complete"] == 0       # a refused record changes nothing


def _acks(sock, idle=0.3) -> list:
    """Headers of the ACKs that reach `sock` until it is quiet for `idle` s."""
    out = []
    sock.settimeout(idle)
    while True:
        try:
            out.append(W.unpack_header(sock.recv(2048)))
        except TimeoutError:
            return out


def _datagram(worker, round_, chunk, *, job=JOB, length=None, nchunks=NCH):
    n = (LAST if chunk == NCH - 1 else CHUNK) if length is None else length
    return W.pack_header(worker=worker, job=job, round=round_, chunk=chunk, nchunks=nchunks,
                         length=n) + bytes([chunk % 256]) * n


@pytest.fixture(scope="module")
def socks(rig):
    out = []
    for h in rig.workers:
        s = rig.socket(h)
        s.bind((h.ip, 0))
        out.append(s)
    yield out
    for s in out:
        s.close()


def _push_round(rig, maps, socks, r: int) -> tuple[list, list[int], list[int]]:
    """Round `r`: each worker sends every chunk through 25 % loss. Checks
    that the drops add up and that ACKs name delivered chunks only; returns
    each worker's done mask, chunks delivered and payload bytes delivered."""
    ps = (rig.ps.ip, W.PORT)
    maps.open_bank(r, NCH, LAST)
    c0, q0 = rig.loss_counters(), rig.bottleneck()[0]
    rig.set_loss(0.25)
    for c in range(NCH):                   # paced: the TBF queue never fills
        for w, s in enumerate(socks):
            s.sendto(_datagram(w, r, c), ps)
        time.sleep(0.0003)
    acks = [_acks(s) for s in socks]
    rig.set_loss(0.0)
    c1, q1 = rig.loss_counters(), rig.bottleneck()[0]
    masks = [maps.done_mask(r, w, NCH) for w in (0, 1)]
    delivered = [int(m.sum()) for m in masks]
    lost = c1["dropped"] - c0["dropped"] + q1.get("drops", 0) - q0.get("drops", 0)
    assert sum(delivered) == 2 * NCH - lost
    assert 0 < lost < NCH                 # p=0.25 over 114 packets
    for a, m in zip(acks, masks):
        got = {h.chunk for h in a}
        assert got <= set(np.nonzero(m)[0].tolist())  # only delivered chunks are ACKed
        # ACKs are best effort (an XDP_TX frame can be dropped on the way back:
        # a veth drops what its peer's ring has no room for while the switch's
        # side waits for a CPU; a sender re-sends and is re-ACKed): nearly all
        # of them arrive (3 of 52 did not once in a full suite on 2 cores)
        assert len(got) >= 0.85 * int(m.sum())
    nbytes = [int(m.sum()) * CHUNK - (CHUNK - LAST) * int(m[-1]) for m in masks]
    return masks, delivered, nbytes


def _send_one_of_each(rig, maps, socks, r: int, got: int) -> None:
    """One packet of each class that has a counter (no loss now): worker 0
    re-sends chunk `got` (dup) and sends a foreign job's; worker 1 sends an
    out-of-range chunk, a malformed one and, after round `r` closes, a late one."""
    ps = (rig.ps.ip, W.PORT)
    socks[0].sendto(_datagram(0, r, got), ps)                                  # dup
    socks[1].sendto(_datagram(1, r, NCH + 2, length=CHUNK), ps)                # out of range
    socks[0].sendto(_datagram(0, r, 0, job=0x99), ps)                          # foreign job
    socks[1].sendto(W.pack_header(worker=1, job=JOB, round=r, chunk=0, nchunks=NCH,
                                  length=6) + b"\0" * 6, ps)                   # malformed
    dup_ack = _acks(socks[0])
    assert [(h.chunk, bool(h.flags & W.F_DUP)) for h in dup_ack] == [(got, True)]
    maps.close_bank(r)
    socks[1].sendto(_datagram(1, r, 0), ps)                                    # late
    late_ack = _acks(socks[1])
    assert [(h.state, h.round) for h in late_ack] == [(W.RS_CLOSED, r)]
    _acks(socks[1], idle=0.05)


@pytest.mark.rig
@requires_bpf
def test_flows_count_what_was_sent_and_delivered(rig, loaded, socks):
    from ltpx.dataplane.xdp.loader import Geometry
    from ltpx.dataplane.xdp.maps import LtpMaps
    maps = LtpMaps.from_pins(loaded["pin_dir"], Geometry(**loaded["geometry"]))
    try:
        masks, delivered, nbytes = _push_round(rig, maps, socks, 1)
        got = int(np.nonzero(masks[0])[0][0])
        _send_one_of_each(rig, maps, socks, 1, got)
        # the control plane's verdict, as Endpoint._collect records it
        for w in (0, 1):
            maps.record_round(w, "complete" if delivered[w] == NCH else "early", delivered[w],
                              NCH - delivered[w], round_=1)
    finally:
        maps.close()

    (snap,) = ltp_json("flows", rig.ps.ifname, "--netns", rig.ps.netns)
    assert (snap["role"], snap["job"], snap["prog_id"]) == ("ps", JOB, loaded["prog_id"])
    assert snap["round_now"] == {"bank": 1, "round": 1, "wire_round": 1, "state": "closed",
                                 "nchunks": NCH}
    _check_rows(snap, delivered, nbytes, dup_bytes=LAST if got == NCH - 1 else CHUNK)
    t = snap["totals"]
    assert (t["malformed"], t["foreign_job"], t["unknown_worker"]) == (1, 1, 0)
    assert t["packets"] == sum(f["packets"] for f in snap["flows"])

    text = ltp("flows", rig.ps.ifname, "--netns", rig.ps.netns).stdout
    assert width(text) <= 80
    assert "program: malformed 1, foreign-job 1" in text
    row1 = next(x for x in text.splitlines() if x.split()[:1] == ["1"])
    assert row1.split()[-2] == f"{100 * (NCH - delivered[1]) / NCH:.1f}%"


def _check_rows(snap: dict, delivered: list[int], nbytes: list[int], dup_bytes: int) -> None:
    """Each worker's row: what it delivered in round 1 plus the one packet of
    each class `_send_one_of_each` sent."""
    rows = {f["worker"]: f for f in snap["flows"]}
    assert sorted(rows) == [0, 1] and [rows[w]["slot"] for w in (0, 1)] == [0, 1]
    extra = {0: {"packets": 1, "acks": 1, "dup": 1, "late": 0, "out_of_range": 0},
             1: {"packets": 1, "acks": 1, "dup": 0, "late": 1, "out_of_range": 1}}
    for w in (0, 1):
        f = rows[w]
        # the dup passed validation (counted as a packet, not delivered); the
        # late, out-of-range and malformed ones did not
        assert f["packets"] == delivered[w] + extra[w]["dup"], f
        assert f["bytes"] == nbytes[w] + dup_bytes * extra[w]["dup"], f
        assert f["acks"] == delivered[w] + extra[w]["acks"], f
        assert (f["dup"], f["late"], f["out_of_range"]) == \
            (extra[w]["dup"], extra[w]["late"], extra[w]["out_of_range"]), f
        assert f["delivered"] == delivered[w]
        assert f["round_chunks"] == delivered[w]
        assert (f["last_round"], f["last_delivered"], f["last_filled"]) == \
            (1, delivered[w], NCH - delivered[w])
        want = "complete" if delivered[w] == NCH else "early"
        assert f["rounds"] == {k: int(k == want) for k in ("complete", "early", "deadline",
                                                            "timeout")}
        assert f["loss"] == pytest.approx((NCH - delivered[w]) / NCH)
        assert f["loss_last"] == f["loss"]

@pytest.mark.rig
@requires_bpf
def test_capture_live_on_both_sides(rig, loaded, socks):
    """On a worker (no ltp_xdp there) an AF_PACKET socket sees its DATA leave
    and the ACKs come back; on the PS, whose ltp_xdp (left by `ltp load`)
    consumes the DATA before any socket could, the program's own capture
    ring shows each DATA as it arrived, with the verdict XDP_TX."""
    from ltpx.dataplane.xdp.loader import Geometry
    from ltpx.dataplane.xdp.maps import LtpMaps
    w0 = rig.workers[0]
    on_w0 = subprocess.Popen([LTP, "capture", w0.ifname, "--netns", w0.netns, "-c", "4", "-j",
                              "--duration", "20"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    on_ps = subprocess.Popen([LTP, "capture", rig.ps.ifname, "--netns", rig.ps.netns, "-j",
                              "-c", "2", "--duration", "20"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert "AF_PACKET" in on_w0.stderr.readline()
        assert "listening on" in on_w0.stderr.readline()
        assert "capturing at ltp_xdp" in on_ps.stderr.readline()
        maps = LtpMaps.from_pins(loaded["pin_dir"], Geometry(**loaded["geometry"]))
        try:
            maps.open_bank(2, NCH, LAST)
            for c in (5, NCH - 1):
                socks[0].sendto(_datagram(0, 2, c), (rig.ps.ip, W.PORT))
            _acks(socks[0], idle=0.2)
            maps.close_bank(2)
        finally:
            maps.close()
        out, w0_err = on_w0.communicate(timeout=20)
        ps_out, ps_err = on_ps.communicate(timeout=20)
    finally:
        for p in (on_w0, on_ps):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert on_w0.returncode == 0 and on_ps.returncode == 0
    pkts = [json.loads(x) for x in out.splitlines()]
    seen = sorted((p["dir"], p["type"], p["chunk"]) for p in pkts)
    assert seen == [("in", "ACK", 5), ("in", "ACK", NCH - 1), ("out", "DATA", 5),
                    ("out", "DATA", NCH - 1)]
    data = next(p for p in pkts if p["type"] == "DATA" and p["chunk"] == NCH - 1)
    assert (data["worker"], data["round"], data["len"], data["src"]) == (0, 2, LAST, w0.ip)
    at_ps = [json.loads(x) for x in ps_out.splitlines()]
    assert [(p["dir"], p["type"], p["chunk"], p["verdict"]) for p in at_ps] == \
        [("in", "DATA", 5, "XDP_TX"), ("in", "DATA", NCH - 1, "XDP_TX")]
    for err in (w0_err, ps_err):
        summary = json.loads(err.splitlines()[-1])
        assert summary["dropped"] == 0 and summary["packets"] in (2, 4)


@pytest.mark.rig
@requires_bpf
def test_top_runs_under_a_terminal_and_quits_on_q(rig, loaded):
    pid, fd = pty.fork()
    if pid == 0:  # child: the real CLI on the pseudo-terminal
        try:
            os.environ.update(COLUMNS="80", LINES="30", TERM="xterm")
            os.execv(LTP, [LTP, "top", "--netns", rig.ps.netns, "--interval", "0.2"])
        finally:
            os._exit(127)
    out = b""

    def read_for(seconds: float) -> None:
        nonlocal out
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            r, _, _ = select.select([fd], [], [], 0.05)
            if r:
                try:
                    out += os.read(fd, 65536)
                except OSError:
                    return
    try:
        read_for(1.5)
        os.write(fd, b"q")
        end = time.monotonic() + 10
        status = None
        while time.monotonic() < end:
            read_for(0.1)
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(st)
                break
    finally:
        if status is None:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)
    assert status == 0, out[-500:]
    assert b"WORKER" in out and rig.ps.netns.encode() in out
    assert out.rstrip().endswith(b"\x1b[?1049l")        # left the alternate screen
    assert b"\x1b[?25h" in out                             # cursor shown again

    batch = ltp("top", "--netns", rig.ps.netns, "--iterations", "2", "--interval", "0.1",
                timeout=20).stdout
    assert batch.count("WORKER") == 2 and width(batch) <= 80
    assert "q quits" not in batch                          # no key works off a terminal
    assert re.search(r"prog \d+ \((native|skb)\)", batch), batch   # phrases kept whole


@pytest.mark.rig
@requires_bpf
def test_top_json_prints_one_snapshot_per_interval(rig, loaded):
    from ltpx.dataplane.xdp.flows import RATE_FIELDS
    p = ltp("top", rig.ps.ifname, "--netns", rig.ps.netns, "-j", "-c", "2", "--interval", "0.1",
            timeout=20)
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(lines) == 2 and lines[1]["time"] > lines[0]["time"]
    for obj in lines:
        assert obj["interval_s"] == 0.1 and obj["errors"] == []
        (snap,) = obj["programs"]
        assert (snap["netns"], snap["dev"], snap["prog_id"]) == \
            (rig.ps.netns, rig.ps.ifname, loaded["prog_id"])
        for f in snap["flows"]:
            assert set(f["rates"]) == set(RATE_FIELDS) and f["rates"]["packets"] == 0


@pytest.mark.rig
@requires_bpf
def test_top_on_a_device_without_a_program_exits_1(rig, loaded):
    err = json.loads(ltp("top", "eth9", "-c", "1", "-j", rc=1, timeout=20).stdout)
    assert err["exit_code"] == 1 and err["error"].startswith("no LTP program loaded on eth9")
    for argv in (["top", "eth9"], ["top", "eth9", "-c", "1"]):     # a terminal or not
        p = ltp(*argv, rc=1, timeout=20)
        assert p.stderr.startswith("ltp: error: no LTP program loaded on eth9"), p.stderr


@pytest.mark.unit
def test_long_titles_break_between_phrases_only():
    from ltpx.tools.cmd_flows import _wrap
    phrases = ["ltp-abc-ps/eth0", "ps", "job 0x00c0ffee", "prog 4711 (native)",
               "round 70000 open, 57 chunks"]
    for cols in (20, 30, 45, 80):
        out = _wrap("  ".join(phrases), cols)
        lines = out.splitlines()
        assert all(len(ln) <= cols for ln in lines), (cols, out)
        joined = " ".join(ln.strip() for ln in lines)
        for ph in ["ltp-abc-ps/eth0", "job 0x00c0ffee", "prog 4711 (native)", "round 70000 open,",
                   "57 chunks"]:
            assert any(ph in ln for ln in lines), (cols, ph, out)
        assert joined.replace("  ", " ").split() == "  ".join(phrases).split()
    assert _wrap("error: first line\nsecond line  more", 80) == \
        "error: first line\nsecond line  more"    # no line is dropped
