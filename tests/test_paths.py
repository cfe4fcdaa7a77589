# SPDX-License-Identifier: Apache-2.0
"""Path assignment (control/pathplan.py) and ECMP path pinning on the leaf-spine
rig (dataplane/rig/leafspine.py, dataplane/rig/pathpin.py, bpf/path_pin.c)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from conftest import reap_rig_owner, requires_bpf
from ltpx.control import pathplan
from ltpx.control.pathplan import Flow, assign
from ltpx.dataplane.xdp import wire as W


# --------------------------------------------------------------------------- the algorithm

def _jobs(n_jobs: int, workers: int, bytes_: int = 100, leaves: int = 2) -> list[Flow]:
    return [Flow(f"j{j}", f"j{j}w{w}", f"j{j}ps", 1 + w % (leaves - 1), 0, bytes_)
            for j in range(n_jobs) for w in range(workers)]


@pytest.mark.unit
@pytest.mark.parametrize("spines,jobs,workers,leaves", [(2, 2, 2, 2), (4, 2, 3, 2),
                                                        (3, 3, 4, 3), (5, 2, 1, 4)])
def test_disjoint_links_when_spines_cover_jobs(spines, jobs, workers, leaves):
    a = assign(spines, _jobs(jobs, workers, leaves=leaves))
    assert a.regime == "exclusive"
    assert a.shared_links() == []
    used = [set(s) for s in a.job_spines().values()]
    assert len(used) == jobs and all(not (x & y) for i, x in enumerate(used) for y in used[i + 1:])
    assert len(a.spine_of) == jobs * workers


@pytest.mark.unit
def test_a_job_with_several_spines_spreads_its_flows():
    a = assign(4, _jobs(2, 2))
    assert a.job_spines() == {"j0": [0, 2], "j1": [1, 3]}
    assert a.max_link_bytes() == 100


@pytest.mark.unit
def test_balanced_when_jobs_outnumber_spines():
    a = assign(2, _jobs(3, 2))                     # 6 equal flows on 2 spines
    assert a.regime == "balanced"
    loads = a.link_bytes()
    up = [loads.get(("L", 1, s), 0) for s in range(2)]
    assert up == [300, 300] and a.max_link_bytes() == 300
    # unequal jobs: the big one first, the small ones fill the other spine
    flows = [Flow("big", "b0", "bp", 1, 0, 400), Flow("s1", "x0", "xp", 1, 0, 200),
             Flow("s2", "y0", "yp", 1, 0, 200)]
    a = assign(2, flows)
    assert a.spine_of[flows[0]] != a.spine_of[flows[1]] == a.spine_of[flows[2]]
    assert a.max_link_bytes() == 400


@pytest.mark.unit
def test_deterministic_and_order_free():
    flows = _jobs(3, 3, leaves=3) + [Flow("j9", "a", "b", 2, 1, 50)]
    a, b = assign(2, flows), assign(2, list(reversed(flows)))
    assert a.spine_of == b.spine_of
    assert a.to_dict() == assign(2, flows).to_dict()


@pytest.mark.unit
def test_intra_leaf_flows_and_bad_input():
    a = assign(2, [Flow("j0", "a", "b", 1, 1)])
    assert a.regime == "none" and not a.spine_of
    with pytest.raises(ValueError, match="spines"):
        assign(0, _jobs(1, 1))
    with pytest.raises(ValueError, match="once"):
        assign(2, _jobs(1, 1) * 2)


# --------------------------------------------------------------------------- on the rig

@pytest.fixture(scope="module")
def ls():
    """A leaf-spine rig (module scope): 2 leaves, 2 spines, 2 jobs x 2 workers,
    skb mode (no XDP_PASS needed: these tests send plain UDP). Needs root + bcc."""
    from ltpx.dataplane.rig.leafspine import LeafSpine, LeafSpineConfig
    name = f"t{os.getpid() % 100000}"
    rig = LeafSpine(LeafSpineConfig(name=name, mode="skb", rate_bps=500_000_000))
    with rig:
        yield rig


def _send(ls, src, dst, n: int = 20, sockets: int = 1, dport: int = W.PORT,
          size: int = 1000) -> None:
    from ltpx.dataplane import netns
    for _ in range(sockets):
        with netns.inside(src.netns):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.bind((src.ip, 0))
            for _ in range(n):
                s.sendto(b"\x00" * size, (dst.ip, dport))
        finally:
            s.close()


def _push_all(ls, **kw) -> None:
    for j in range(ls.config.jobs):
        job = ls.job(j)
        for w in job.workers:
            _send(ls, w, job.ps, **kw)
    time.sleep(0.05)


def _job_spines(obs: dict) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for link, d in obs["link_bytes"].items():
        for job, v in d.items():
            if v and ":" not in job and job != "other":
                out.setdefault(job, set()).add(int(link.split(">")[0 if link[0] == "s" else 1][1:]))
    return out


@pytest.mark.rig
@requires_bpf
def test_every_worker_reaches_its_ps_and_back(ls):
    from ltpx.dataplane.rig.leafspine import reachable
    for j in range(ls.config.jobs):
        job = ls.job(j)
        assert job.ps.leaf == 0 and all(w.leaf == 1 for w in job.workers)
        for w in job.workers:
            assert reachable(ls, w, job.ps), f"{w.name} -> {job.ps.name}"
            assert reachable(ls, job.ps, w, port=9998), f"{job.ps.name} -> {w.name}"


@pytest.mark.rig
@requires_bpf
def test_pinned_flows_use_only_their_spine_then_unpin_returns_to_ecmp(ls):
    a = assign(ls.config.spines, pathplan.rig_flows(ls))
    pins = pathplan.pin(ls, a)
    assert len(pins) == 4 and len(ls.pins_now()) == 4
    ls.reset_link_counters()
    _push_all(ls, sockets=4)          # 4 sockets per worker: ephemeral ports, all rewritten
    obs = pathplan.observe(ls)
    want = {j: set(s) for j, s in a.job_spines().items()}
    assert _job_spines(obs) == want == {"j0": {0}, "j1": {1}}
    assert obs["shared_links"] == []
    for f in obs["flows"]:            # every pushed byte left with a pinned source port
        assert f["sport"] in {p["sport"] for p in pins}
    for link, d in obs["link_bytes"].items():
        for job, spines in want.items():
            if d.get(job):
                assert ls.link(link).spine in spines

    ls.clear_pins()                   # back to ECMP: 16 fresh 5-tuples per job spread out
    ls.reset_link_counters()
    _push_all(ls, n=2, sockets=8)
    assert _job_spines(pathplan.observe(ls)) == {"j0": {0, 1}, "j1": {0, 1}}


@pytest.mark.rig
@requires_bpf
def test_rewritten_packets_keep_a_valid_checksum(ls):
    """The PS's socket only gets datagrams whose UDP checksum is right."""
    from ltpx.dataplane import netns
    job = ls.job(0)
    w = job.workers[0]
    a = assign(ls.config.spines, pathplan.rig_flows(ls))
    pins = {p["src"]: p["sport"] for p in pathplan.pin(ls, a)}
    with netns.inside(job.ps.netns):
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind((job.ps.ip, W.PORT))
        rx.settimeout(1.0)
        for size in (1, 999, 1472):
            _send(ls, w, job.ps, n=1, size=size)
            data, addr = rx.recvfrom(2048)
            assert len(data) == size
            assert addr == (w.ip, pins[w.name])
    finally:
        rx.close()
        ls.clear_pins()


@pytest.mark.rig
@requires_bpf
def test_cli_show_json(ls):
    r = subprocess.run([sys.executable, "-m", "ltpx.tools.cli", "paths", "show", "--name",
                        ls.name, "-j"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(r.stdout)
    assert d["name"] == ls.name and len(d["routers"]) == 4 and len(d["jobs"]) == 2
    assert len(d["links"]) == 8 and all(lk["bytes"] is not None for lk in d["links"])
    assert set(d["link_bytes"]) == {"l0>s0", "l0>s1", "l1>s0", "l1>s1",
                                    "s0>l0", "s0>l1", "s1>l0", "s1>l1"}


@pytest.mark.rig
@requires_bpf
def test_cli_rig_up_pin_down():
    """`ltp rig up --topology leaf-spine`, `ltp paths pin`, `ltp paths down`."""
    from ltpx.dataplane.rig.leafspine import LeafSpine
    name = f"c{os.getpid() % 100000}"

    def ltp(*argv):
        r = subprocess.run([sys.executable, "-m", "ltpx.tools.cli", *argv, "-j"],
                           capture_output=True, text=True, timeout=120)
        return r.returncode, json.loads(r.stdout or "{}")
    try:
        rc, up = ltp("rig", "up", "--topology", "leaf-spine", "--name", name, "--workers", "1",
                     "--jobs", "2", "--spines", "3", "--rate", "100mbit", "--mode", "skb")
        assert rc == 0, up
        assert [j["workers"] for j in up["jobs"]] == [["j0w0"], ["j1w0"]]
        assert len(up["routers"]) == 5 and len(up["links"]) == 12
        rc, pin = ltp("paths", "pin", "--name", name)
        assert rc == 0, pin
        assert pin["assignment"]["job_spines"] == {"j0": [0], "j1": [1]}
        rc, unpin = ltp("paths", "pin", "--name", name, "--policy", "ecmp")
        assert rc == 0 and unpin["pins"] == []
        assert ltp("rig", "up", "--topology", "leaf-spine", "--name", name, "--jobs", "9")[0] == 2
        rc, _ = ltp("paths", "down", "--name", name)
        assert rc == 0 and not LeafSpine.exists(name)
    finally:
        LeafSpine.destroy(name) if LeafSpine.exists(name) else None


@pytest.mark.rig
@requires_bpf
def test_teardown_is_clean(ls):
    from ltpx.dataplane import netns
    from ltpx.dataplane.rig.leafspine import LeafSpine, pin_dir, state_path
    spaces = ls.namespaces
    assert all(netns.exists(n) for n in spaces)
    ls.down()
    assert not any(netns.exists(n) for n in spaces)
    assert not os.path.exists(pin_dir(ls.name)) and not os.path.exists(state_path(ls.name))
    assert not LeafSpine.exists(ls.name)


_KILLED_OWNER = """
import sys, time
from ltpx.dataplane.rig.leafspine import LeafSpine, LeafSpineConfig
with LeafSpine(LeafSpineConfig(name=sys.argv[1], spines=1, jobs=1, workers=1, mode="skb")):
    print("ready", flush=True)
    time.sleep(120)
"""


@pytest.mark.rig
@requires_bpf
def test_up_removes_the_rig_of_a_killed_with_block():
    """A `with LeafSpine(...)` whose process is SIGKILLed leaves its namespaces;
    the next `up()` of that name removes them (the owner is dead) and builds."""
    import signal
    from ltpx.dataplane import netns
    from ltpx.dataplane.rig.leafspine import LeafSpine, LeafSpineConfig, state_path
    name = f"k{os.getpid() % 100000}"
    cfg = LeafSpineConfig(name=name, spines=1, jobs=1, workers=1, mode="skb")
    p = subprocess.Popen([sys.executable, "-c", _KILLED_OWNER, name], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        assert LeafSpine.owner(name) == p.pid              # a live owner, saved in the state
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=20)
        left = LeafSpine(cfg).namespaces
        assert all(netns.exists(n) for n in left)          # nothing removed it
        assert LeafSpine.owner(name) is None
        rig = LeafSpine(cfg).up()                          # no "exists already"
        assert all(netns.exists(n) for n in left)
        with open(state_path(name)) as f:
            st = json.load(f)
        assert st["state"] == "up" and st["owner_pid"] is None   # persistent: no owner
        rig.down()
        assert not LeafSpine.exists(name)
    finally:
        reap_rig_owner(p, LeafSpine, name)


# --------------------------------------------------------------------------- path_pin packet table

def _pkt(dport=W.PORT, sport=41000, proto="udp", chksum=None, payload=b"\x11" * 37):
    from scapy.layers.inet import IP, TCP, UDP
    from scapy.layers.l2 import Ether
    l4 = (UDP(sport=sport, dport=dport, chksum=chksum) if proto == "udp"
          else TCP(sport=sport, dport=dport))
    return bytes(Ether(src="02:4c:48:01:00:00", dst="02:4c:47:01:00:01") /
                 IP(src="198.18.11.10", dst="198.18.10.10") / l4 / payload)


PIN_TABLE = [
    # description, packet, expected source port, checksum: "valid" | "zero" | "same"
    ("pinned flow: sport rewritten, checksum fixed", _pkt(), 20001, "valid"),
    ("pinned flow without checksum: stays 0", _pkt(chksum=0), 20001, "zero"),
    ("pinned flow, already the pinned port: untouched", _pkt(sport=20001), 20001, "same"),
    ("other destination port: untouched (ECMP)", _pkt(dport=9), 41000, "same"),
    ("TCP: untouched", _pkt(proto="tcp"), 41000, "same"),
]


@pytest.fixture(scope="module")
def pin_prog():
    """path_pin compiled once (module scope) with one pin: 198.18.11.10 ->
    198.18.10.10:7410 leaves with source port 20001. Yields the program fd."""
    from ltpx.dataplane.rig import pathpin
    from ltpx.dataplane.xdp.loader import compile_program
    b, _ = compile_program("path_pin.c", "link_count", prog_type="SCHED_CLS")
    try:
        fn = b.load_func(b"path_pin", b.SCHED_CLS)
        fd = b[b"path_pins"].get_fd()
        pathpin.set_pin(fd, "198.18.11.10", "198.18.10.10", W.PORT, 20001, 0)
        assert pathpin.read_pins(fd) == [{"saddr": "198.18.11.10", "daddr": "198.18.10.10",
                                          "dport": W.PORT, "sport": 20001, "spine": 0,
                                          "packets": 0}]
        yield fn.fd
    finally:
        b.cleanup()


@pytest.mark.rig
@requires_bpf
@pytest.mark.parametrize("desc,packet,sport,csum", PIN_TABLE, ids=[t[0] for t in PIN_TABLE])
def test_path_pin_packets(pin_prog, desc, packet, sport, csum):
    from scapy.layers.inet import IP, TCP, UDP
    from scapy.layers.l2 import Ether
    from ltpx.dataplane.xdp.testrun import run_xdp
    res = run_xdp(pin_prog, packet)
    assert res.verdict == 0                                   # TC_ACT_OK: never drops
    out, before = Ether(res.data), Ether(packet)
    l4 = out[UDP] if UDP in out else out[TCP]
    assert l4.sport == sport, desc
    if csum == "same":
        assert res.data == packet
    elif csum == "zero":
        assert l4.chksum == 0
    else:
        fixed = IP(bytes(out[IP]))
        want = fixed[UDP].chksum
        del fixed[UDP].chksum
        assert IP(bytes(fixed))[UDP].chksum == want
        assert bytes(out[UDP].payload) == bytes(before[UDP].payload)


@pytest.mark.rig
@requires_bpf
def test_python_structs_match_bpf_structs():
    """dataplane/rig/pathpin.py's ctypes mirrors have the sizes bcc sees in bpf/path_pin.c."""
    import ctypes
    from ltpx.dataplane.rig.pathpin import LinkKey, LinkVal, PinKey, PinVal
    from ltpx.dataplane.xdp.loader import compile_program
    b, _ = compile_program("path_pin.c", "link_count", prog_type="SCHED_CLS")
    try:
        for table, key, val in ((b"link_bytes", LinkKey, LinkVal),
                                (b"path_pins", PinKey, PinVal)):
            t = b[table]
            assert ctypes.sizeof(t.Key) == ctypes.sizeof(key), table
            assert ctypes.sizeof(t.Leaf) == ctypes.sizeof(val), table
            assert [f[0] for f in t.Key._fields_] == [f[0] for f in key._fields_], table
    finally:
        b.cleanup()
