"""`ltp load/unload/status/flows/top/capture`: the real CLI as subprocesses.

One rig (PS + 2 workers) serves the module. The PS program is loaded by
`ltp load`; this process plays the control plane on its pins (open/close a
round, record its outcome) and sends LTP DATA from the workers with plain UDP
sockets, with the rig's loss injector dropping some. Tests run in file order:
the last ones replace and unload what the first ones loaded.
"""
from __future__ import annotations

import json
import os
import pty
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import WHY_NOT_BPF, requires_bpf
from ltpx.dataplane.xdp import wire as W
from ltpx.dataplane.xdp.loader import MAP_NAMES

LTP = str(Path(sys.executable).parent / "ltp")
RIG = f"ops{os.getpid() % 100000}"
JOB = 0x17
NEL = 20_000                     # 57 chunks of 1424 bytes, the last 256 bytes
CHUNK = 1424
NCH = -(-NEL * 4 // CHUNK)
LAST = NEL * 4 - (NCH - 1) * CHUNK
requires_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def ltp(*args: str, rc: int | None = 0, timeout: float = 60, env=None
        ) -> subprocess.CompletedProcess:
    p = subprocess.run([LTP, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       env=env)
    if rc is not None:
        assert p.returncode == rc, (args, p.returncode, p.stdout, p.stderr)
    return p


def ltp_json(*args: str, rc: int = 0):
    return json.loads(ltp(*args, "-j", rc=rc).stdout)


def width(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


# --------------------------------------------------------------------------- no rig needed

@pytest.mark.parametrize("argv,needle", [
    (["load", "bad/dev", "--role", "ps", "--workers", "2"], "not a device name"),
    (["load", "a-very-long-device-name", "--role", "ps", "--workers", "2"], "not a device name"),
    (["load", "eth9", "--workers", "2"], "--role"),
    (["load", "eth9", "--role", "ps"], "--workers"),
    (["load", "eth9", "--role", "worker", "--workers", "2"], "--workers"),
    (["load", "eth9", "--role", "worker"], "--id"),
    (["load", "eth9", "--role", "ps", "--workers", "2", "--job", "cookie"], "--job"),
    (["load", "eth9", "--role", "ps", "--workers", "2", "--chunk-bytes", "1004"], "--chunk-bytes"),
    (["unload"], "DEV"),
    (["unload", "eth9", "--all"], "DEV"),
    (["capture"], "DEV"),
    (["capture", "eth9", "-r", "x.pcap"], "DEV"),
    (["top", "--interval", "0"], "--interval"),
])
def test_usage_errors_exit_2_with_json_errors(argv, needle):
    p = ltp(*argv, "-j", rc=2) if argv[0] != "top" else ltp(*argv, rc=2)
    if argv[0] != "top":
        err = json.loads(p.stdout)
        assert err["exit_code"] == 2 and needle in err["error"]
    else:
        assert needle in p.stderr


@requires_root
def test_missing_bcc_names_the_fix(tmp_path):
    fake = tmp_path / "bcc"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    p = ltp("load", "eth9", "--role", "ps", "--workers", "2", rc=1, env=env)
    assert "bcc is not importable" in p.stderr and "ltp doctor --fix" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


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
    assert "3 LTP packets, 1 other skipped" in p.stderr

    text = ltp("capture", "-r", f).stdout.splitlines()
    assert "DATA w=3 r=9 c=2/4 len=16 flags=critical,last job=0x17" in text[0]
    assert "ACK w=3 r=9 c=2/4 len=0 flags=dup job=0x17 state=closed rate=250000k" in text[1]

    out = tmp_path / "copy.pcap"
    assert len(ltp("capture", "-r", f, "-c", "2", "-w", out).stdout.splitlines()) == 2
    assert [r["type"] for r in json.loads(ltp("capture", "-r", out, "-p").stdout)] == \
        ["DATA", "ACK"]
    assert json.loads(ltp("capture", "-r", tmp_path / "none.pcap", "-j", rc=1).stdout)["error"]


# --------------------------------------------------------------------------- on a rig

@pytest.fixture(scope="module")
def rig():
    """Rig RIG (PS + 2 workers, loss injector toward the PS); on the way out,
    whatever `ltp load` left in its namespaces is unloaded, also on failure."""
    if WHY_NOT_BPF:
        pytest.skip(WHY_NOT_BPF)
    from ltpx.dataplane.xdp import registry
    from ltpx.dataplane.rig.star import Rig, RigConfig
    with Rig(RigConfig(name=RIG, workers=2, loss=0.0)) as r:
        try:
            yield r
        finally:
            for ns in r.namespaces:
                for n, dev in registry.entries(ns):
                    registry.unload(dev, n)


@pytest.fixture(scope="module")
def loaded(rig):
    """`ltp load` on the PS (native, job 0x17, 2 workers, 20000-element rounds)."""
    return ltp_json("load", rig.ps.ifname, "--netns", rig.ps.netns, "--role", "ps",
                    "--workers", 2, "--max-elems", NEL, "--job", hex(JOB))


def _ours(rig, rows):
    return [r for r in rows if r["netns"] in rig.namespaces]


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
        m.record_round(1, "early", 50, 7, round_=3)
        m.record_round(1, "complete", 57, 0, round_=4)
        assert m.round_stats(1) == {"complete": 1, "early": 1, "deadline": 0, "timeout": 0,
                                    "delivered": 107, "filled": 7, "last_round": 4,
                                    "last_delivered": 57, "last_filled": 0}
        with pytest.raises(ValueError, match="reason"):
            m.record_round(0, "lost", 1, 1)


@requires_bpf
def test_load_then_status_lists_exactly_it(rig, loaded):
    from ltpx.dataplane.xdp import registry
    assert (loaded["role"], loaded["job"], loaded["mode"], loaded["netns"], loaded["dev"]) == \
        ("ps", JOB, "native", rig.ps.netns, rig.ps.ifname)
    assert loaded["geometry"] == {"slots": 2, "max_chunks": 64, "chunk_bytes": CHUNK, "banks": 2,
                                  "port": W.PORT}
    assert loaded["peers"] == {"0": 0, "1": 1}
    att = registry.xdp_on(rig.ps.ifname, rig.ps.netns)
    assert att == {"prog_id": loaded["prog_id"], "mode": "native"}
    assert os.path.isdir(loaded["pin_dir"]) and os.path.exists(loaded["record"])

    rows = _ours(rig, ltp_json("status"))
    assert len(rows) == 1
    (s,) = rows
    assert (s["netns"], s["dev"], s["mode"], s["prog_id"], s["role"], s["job"], s["state"],
            s["maps_pinned"], s["geometry"]) == \
        (rig.ps.netns, rig.ps.ifname, "native", loaded["prog_id"], "ps", JOB, "ok", len(MAP_NAMES),
         loaded["geometry"])
    text = ltp("status").stdout
    assert width(text) <= 80
    assert text.splitlines()[0].split() == ["NAMESPACE", "DEVICE", "MODE", "PROG", "ROLE", "JOB",
                                            "MAPS", "STATE"]
    line = next(x for x in text.splitlines() if x.startswith(rig.ps.netns))
    assert line.split() == [rig.ps.netns, rig.ps.ifname, "native", str(loaded["prog_id"]), "ps",
                            "0x17", str(len(MAP_NAMES)), "ok"]


@requires_bpf
def test_second_load_and_bad_devices_are_refused(rig, loaded):
    from ltpx.dataplane.xdp import registry
    base = ["--role", "ps", "--workers", "2"]
    err = ltp_json("load", rig.ps.ifname, "--netns", rig.ps.netns, *base, rc=1)
    assert "loaded already" in err["error"] and "--force" in err["error"]
    assert registry.xdp_on(rig.ps.ifname, rig.ps.netns)["prog_id"] == loaded["prog_id"]

    p = ltp("load", "nosuchdev", "--netns", rig.ps.netns, *base, rc=1)
    assert "no device 'nosuchdev'" in p.stderr
    err = ltp_json("load", rig.ps.ifname, "--netns", f"ltp-{RIG}-nope", *base, rc=1)
    assert "no network namespace" in err["error"]
    err = ltp_json("flows", "nosuchdev", "--netns", rig.ps.netns, rc=1)
    assert "no LTP program loaded on nosuchdev" in err["error"]
    err = ltp_json("flows", rig.ps.ifname, rc=1)           # host namespace: says where it is
    assert f"{rig.ps.ifname} in {rig.ps.netns} (add --netns)" in err["error"]
    assert not os.path.exists(registry.pin_dir("nosuchdev", rig.ps.netns))


def _acks(sock, idle=0.3) -> list:
    """Headers of the ACKs that reach `sock` until it is quiet for `idle` s."""
    out = []
    sock.settimeout(idle)
    while True:
        try:
            out.append(W.unpack_header(sock.recv(2048)))
        except socket.timeout:
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


@requires_bpf
def test_flows_count_what_was_sent_and_delivered(rig, loaded, socks):
    from ltpx.dataplane.xdp.loader import Geometry
    from ltpx.dataplane.xdp.maps import LtpMaps
    maps = LtpMaps.from_pins(loaded["pin_dir"], Geometry(**loaded["geometry"]))
    ps = (rig.ps.ip, W.PORT)
    try:
        r = 1
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
            # ACKs are best effort (an XDP_TX frame can be dropped on the way back;
            # a sender re-sends and is re-ACKed): nearly all of them arrive.
            assert len(got) >= int(m.sum()) - 2
        nbytes = [int(m.sum()) * CHUNK - (CHUNK - LAST) * int(m[-1]) for m in masks]

        # the classes that have a counter, one packet each (no loss now)
        got = int(np.nonzero(masks[0])[0][0])
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

        # the control plane's verdict, as Endpoint._collect records it
        for w in (0, 1):
            maps.record_round(w, "complete" if delivered[w] == NCH else "early", delivered[w],
                              NCH - delivered[w], round_=r)
    finally:
        maps.close()

    (snap,) = ltp_json("flows", rig.ps.ifname, "--netns", rig.ps.netns)
    assert (snap["role"], snap["job"], snap["prog_id"]) == ("ps", JOB, loaded["prog_id"])
    assert snap["round_now"] == {"bank": 1, "round": 1, "state": "closed", "nchunks": NCH}
    rows = {f["worker"]: f for f in snap["flows"]}
    assert sorted(rows) == [0, 1] and [rows[w]["slot"] for w in (0, 1)] == [0, 1]
    extra = {0: {"packets": 1, "acks": 1, "dup": 1, "late": 0, "out_of_range": 0},
             1: {"packets": 1, "acks": 1, "dup": 0, "late": 1, "out_of_range": 1}}
    for w in (0, 1):
        f = rows[w]
        # the dup passed validation (counted as a packet, not delivered); the
        # late, out-of-range and malformed ones did not
        dup_bytes = LAST if got == NCH - 1 else CHUNK
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
    t = snap["totals"]
    assert (t["malformed"], t["foreign_job"], t["unknown_worker"]) == (1, 1, 0)
    assert t["packets"] == sum(f["packets"] for f in snap["flows"])

    text = ltp("flows", rig.ps.ifname, "--netns", rig.ps.netns).stdout
    assert width(text) <= 80
    assert "program: malformed 1, foreign-job 1" in text
    row1 = next(x for x in text.splitlines() if x.split()[:1] == ["1"])
    assert row1.split()[-2] == f"{100 * (NCH - delivered[1]) / NCH:.1f}%"


@requires_bpf
def test_capture_live_sees_the_sender_side_only(rig, loaded, socks):
    from ltpx.dataplane.xdp.loader import Geometry
    from ltpx.dataplane.xdp.maps import LtpMaps
    w0 = rig.workers[0]
    on_w0 = subprocess.Popen([LTP, "capture", w0.ifname, "--netns", w0.netns, "-c", "4", "-j",
                              "--timeout", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    on_ps = subprocess.Popen([LTP, "capture", rig.ps.ifname, "--netns", rig.ps.netns, "-j",
                              "--timeout", "3"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        for p in (on_w0, on_ps):
            assert "listening on" in p.stderr.readline()
        maps = LtpMaps.from_pins(loaded["pin_dir"], Geometry(**loaded["geometry"]))
        try:
            maps.open_bank(2, NCH, LAST)
            for c in (5, NCH - 1):
                socks[0].sendto(_datagram(0, 2, c), (rig.ps.ip, W.PORT))
            _acks(socks[0], idle=0.2)
            maps.close_bank(2)
        finally:
            maps.close()
        out, _ = on_w0.communicate(timeout=20)
        ps_out, _ = on_ps.communicate(timeout=10)
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
    assert ps_out == ""      # native XDP consumed the DATA and sent the ACKs itself


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


@requires_bpf
def test_force_replaces_and_unload_all_leaves_nothing(rig, loaded):
    from ltpx.dataplane.xdp import registry
    w1 = rig.workers[1]
    new = ltp_json("load", rig.ps.ifname, "--netns", rig.ps.netns, "--role", "ps", "--workers",
                   2, "--max-chunks", 64, "--mode", "skb", "--force")
    assert new["prog_id"] != loaded["prog_id"] and new["mode"] == "skb"
    assert registry.xdp_on(rig.ps.ifname, rig.ps.netns) == {"prog_id": new["prog_id"],
                                                            "mode": "skb"}
    wk = ltp_json("load", w1.ifname, "--netns", w1.netns, "--role", "worker", "--id", 1,
                  "--mode", "skb")
    assert wk["peers"] == {"1": 0} and wk["geometry"]["slots"] == 1
    rows = _ours(rig, ltp_json("status"))
    assert sorted((r["dev"], r["role"], r["prog_id"], r["state"]) for r in rows) == sorted(
        [(rig.ps.ifname, "ps", new["prog_id"], "ok"), (w1.ifname, "worker", wk["prog_id"], "ok")])

    gone = ltp_json("unload", "--all")
    assert {(g["netns"], g["dev"]) for g in gone} >= {(rig.ps.netns, rig.ps.ifname),
                                                       (w1.netns, w1.ifname)}
    assert all(g["detached"] for g in gone if g["netns"] in rig.namespaces)
    assert registry.xdp_on(rig.ps.ifname, rig.ps.netns) is None
    assert registry.xdp_on(w1.ifname, w1.netns) is None
    assert registry.entries() == []
    for ns in rig.namespaces:
        assert not os.path.exists(os.path.join(registry.PIN_ROOT, ns))
        assert not os.path.exists(os.path.join(registry.RECORD_ROOT, ns))
    assert ltp_json("status") == [] and ltp_json("flows") == []
    assert "nothing to unload" in ltp("unload", "--all").stdout


@requires_bpf
def test_unload_removes_a_record_whose_namespace_is_gone(rig):
    from pyroute2 import IPRoute

    from ltpx.dataplane import netns
    from ltpx.dataplane.xdp import registry
    ns = f"ltp-{RIG}-gone"
    netns.create(ns)
    try:
        with netns.inside(ns):
            ipr = IPRoute()
        try:
            ipr.link("add", ifname="g0", kind="veth", peer={"ifname": "g1"})
            for name in ("g0", "g1"):
                ipr.link("set", index=ipr.link_lookup(ifname=name)[0], state="up")
        finally:
            ipr.close()
        rec = ltp_json("load", "g0", "--netns", ns, "--role", "worker", "--id", 7, "--mode", "skb")
        netns.remove(ns)
        (row,) = [r for r in ltp_json("status") if r["netns"] == ns]
        assert row["state"] == "no netns" and row["maps_pinned"] == len(MAP_NAMES)
        (done,) = ltp_json("unload", "g0", "--netns", ns)
        assert done["prog_id"] == rec["prog_id"] and "gone" in done["note"]
        assert not os.path.exists(rec["pin_dir"]) and not os.path.exists(rec["record"])
        assert registry.entries(ns) == []
    finally:
        if netns.exists(ns):
            netns.remove(ns)
        for n, dev in registry.entries(ns):
            registry.unload(dev, n)
