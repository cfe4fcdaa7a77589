# SPDX-License-Identifier: Apache-2.0
"""The namespace rig (dataplane/rig/star.py, `ltp rig`): lifecycle, reachability,
isolation, the loss injector, the CLI's argument checks.

Privileged tests skip with a reason when not root or when bcc is missing.
Rig names are unique per test run, so other rigs on the machine are never
touched (no test calls Rig.down_all()).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import reap_rig_owner, sigint_default

try:
    import bcc  # noqa: F401
    _HAVE_BCC = True
except ImportError:
    _HAVE_BCC = False

_WHY = ("needs root (netns, tc, BPF)" if os.geteuid() != 0 else
        "needs bcc (Debian's python3-bpfcc in a --system-site-packages venv)" if not _HAVE_BCC
        else "")
privileged = pytest.mark.skipif(bool(_WHY), reason=_WHY or "ok")

_TAG = f"{os.getpid() % 100000}"
LTP = Path(sys.executable).with_name("ltp")


def _ltp(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = [str(LTP)] if LTP.exists() else [sys.executable, "-m", "ltpx.tools.cli"]
    return subprocess.run(cmd + list(argv), capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------- CLI argument checks

@pytest.mark.rig           # the commands build a rig when a check fails to refuse
@pytest.mark.parametrize("argv, flag", [
    (["up", "--loss", "1.5"], "--loss"),
    (["up", "--loss", "1"], "--loss"),
    (["up", "--loss", "-0.1"], "--loss"),
    (["up", "--loss", "x"], "--loss"),
    (["up", "--workers", "0"], "--workers"),
    (["up", "--workers", "65"], "--workers"),
    (["up", "--rate", "fast"], "--rate"),
    (["up", "--rate", "0"], "--rate"),
    (["up", "--rate", "100gbit"], "--rate"),
    (["up", "--buffer", "10"], "--buffer"),
    (["up", "--buffer", "lots"], "--buffer"),
    (["up", "--name", "Bad-Name"], "--name"),
    (["up", "--shape", "some"], "--shape"),
    (["up", "--workers", "4", "--nodes", "3"], "--nodes"),
    (["up", "--workers", "4", "--nodes", "2", "--shape", "ps"], "--nodes"),
    (["up", "--workers", "4", "--nodes", "2", "--colocate"], "--colocate"),
    (["check", "--loss", "2"], "--loss"),
    (["check", "--workers", "100"], "--workers"),
    (["incast-tcp", "--size", "0"], "--size"),
    (["incast-tcp", "--rounds", "0"], "--rounds"),
    (["incast-tcp", "--cc", "vegas2"], "--cc"),
])
def test_bad_arguments_exit_2_naming_the_argument(argv, flag):
    r = _ltp("rig", *argv)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert flag in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.rig
def test_bad_argument_with_json_is_json():
    r = _ltp("rig", "up", "--loss", "1.5", "-j")
    assert r.returncode == 2
    err = json.loads(r.stdout)
    assert err["exit_code"] == 2 and "--loss" in err["error"]


@pytest.mark.unit
def test_config_validation_names_the_field():
    from ltpx.dataplane.rig.star import RigConfig
    for kw, field in [({"workers": 0}, "workers"), ({"loss": 1.0}, "loss"),
                      ({"buffer_bytes": 100}, "buffer"), ({"name": "x" * 13}, "name"),
                      ({"mode": "fast"}, "mode"), ({"rate_bps": 10}, "rate")]:
        with pytest.raises(ValueError, match=f"^{field}"):
            RigConfig(**kw)
    assert RigConfig(rate_bps=10**9).burst == 10_000   # 80 us at 1 Gbit/s


@pytest.mark.unit
def test_plan_addresses_fit_64_workers():
    from ltpx.dataplane.rig.star import plan_hosts
    hosts = plan_hosts("abcdefghijkl", 64)
    assert hosts[0].ip == "198.18.0.1" and hosts[0].role == "ps"
    assert [h.ip for h in hosts[1:3]] == ["198.18.0.10", "198.18.0.11"]
    assert len({h.ip for h in hosts}) == len({h.mac for h in hosts}) == 65
    assert all(len(h.ifname) <= 15 and len(h.port) <= 15 for h in hosts)
    assert hosts[-1].netns == "ltp-abcdefghijkl-w63"


# --------------------------------------------------------------------------- helpers (privileged)

def _links_in_nsfd(fd: int) -> list[str]:
    """Interface names in the namespace behind `fd` (kept alive by the fd
    even after its /run/netns name is gone)."""
    from pyroute2 import IPRoute
    from ltpx.dataplane import clib
    here = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        clib.setns(fd)
        try:
            with IPRoute() as ipr:
                return sorted(link.get_attr("IFLA_IFNAME") for link in ipr.get_links())
        finally:
            clib.setns(here)
    finally:
        os.close(here)


def _prog_id(pinned: str) -> int:
    from ltpx.dataplane import clib
    fd = clib.obj_get(pinned)
    try:
        info = clib.obj_info(fd)          # struct bpf_prog_info: type, id, ...
    finally:
        os.close(fd)
    return int.from_bytes(info[4:8], "little")


def _prog_exists(prog_id: int) -> bool:
    from ltpx.dataplane import clib
    try:
        os.close(clib.prog_fd_by_id(prog_id))
        return True
    except FileNotFoundError:
        return False


def _root_links() -> set[str]:
    from pyroute2 import IPRoute
    with IPRoute() as ipr:
        return {link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}


def _gone(rig_name: str, held: dict[str, int], loss_prog: int) -> None:
    from ltpx.dataplane import netns
    from ltpx.dataplane.rig.star import pin_dir, state_path
    assert not [n for n in netns.listnetns() if n.startswith(f"ltp-{rig_name}-")]
    assert not os.path.exists(state_path(rig_name))
    assert not os.path.exists(pin_dir(rig_name))
    for ns, fd in held.items():
        # the namespace object is still alive through our fd: it must be empty
        assert _links_in_nsfd(fd) == ["lo"], ns
    deadline = time.monotonic() + 3.0
    while _prog_exists(loss_prog) and time.monotonic() < deadline:
        time.sleep(0.05)      # programs are freed after an RCU grace period
    assert not _prog_exists(loss_prog), "loss_tc program still loaded"


# --------------------------------------------------------------------------- lifecycle

@privileged
@pytest.mark.rig
@pytest.mark.parametrize("body_raises", [False, True])
def test_up_and_down_leave_nothing_behind(body_raises):
    from ltpx.dataplane.rig.star import Rig, RigConfig, pin_dir, state_path
    name = f"l{'r' if body_raises else 'o'}{_TAG}"
    before = _root_links()
    held: dict[str, int] = {}
    loss_prog = 0

    class Boom(RuntimeError):
        pass

    try:
        with Rig(RigConfig(name=name, workers=5, loss=0.01, shape="all", loss_on="all")) as rig:
            for ns in (rig.switch_ns, rig.ps.netns, rig.workers[-1].netns):
                held[ns] = os.open(f"/run/netns/{ns}", os.O_RDONLY)
            assert os.path.exists(state_path(name)) and os.path.isdir(pin_dir(name))
            att = rig.attachments()
            assert set(att) == {h.port for h in rig.hosts}
            assert all(a["xdp_prog_id"] for a in att.values())          # XDP_PASS, native
            assert all("bpf" in a["egress_filters"] for a in att.values())  # loss on all
            assert all(q["present"] for q in rig.bottleneck())             # TBF on all
            assert len(_links_in_nsfd(held[rig.switch_ns])) == 1 + 1 + 6  # lo, br0, 6 ports
            loss_prog = _prog_id(rig.pins["loss_prog"])
            assert _prog_exists(loss_prog)
            assert _root_links() == before          # nothing in the machine's namespace
            if body_raises:
                raise Boom("body failed")
    except Boom:
        assert body_raises
    try:
        _gone(name, held, loss_prog)
    finally:
        for fd in held.values():
            os.close(fd)


_SIGNAL_SCRIPT = textwrap.dedent("""
    import sys, time
    from ltpx.dataplane.rig.star import Rig, RigConfig
    with Rig(RigConfig(name=sys.argv[1], workers=1)) as rig:
        print("ready", flush=True)
        time.sleep(60)
""")


@privileged
@pytest.mark.rig
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_tears_the_rig_down(sig):
    from ltpx.dataplane import netns
    from ltpx.dataplane.rig.star import Rig
    name = f"s{sig}x{_TAG}"
    p = subprocess.Popen([sys.executable, "-c", _SIGNAL_SCRIPT, name], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        assert netns.exists(f"ltp-{name}-sw")
        p.send_signal(sig)
        p.wait(timeout=20)
        assert p.returncode != 0
        assert not Rig.exists(name), f"rig {name} left behind after {sig!r}"
    finally:
        reap_rig_owner(p, Rig, name)


@privileged
@pytest.mark.rig
def test_a_rig_whose_owner_was_killed_goes_with_the_next_rig_built():
    """SIGKILL leaves no chance to tear down: the next rig built (under
    any name) removes the rig its state says a dead process owned."""
    from ltpx.dataplane import netns
    from ltpx.dataplane.rig.star import Rig, RigConfig
    name, other = f"k{_TAG}", f"n{_TAG}"
    p = subprocess.Popen([sys.executable, "-c", _SIGNAL_SCRIPT, name], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=20)
        assert Rig.exists(name) and Rig._owner_died(name)     # left behind, its owner gone
        with Rig(RigConfig(name=other, workers=1)):
            assert not Rig.exists(name) and not netns.exists(f"ltp-{name}-sw")
        assert not Rig.exists(other)
    finally:
        reap_rig_owner(p, Rig, name)


# --------------------------------------------------------------------------- one shared rig

@pytest.fixture(scope="module")
def rig():
    if _WHY:
        pytest.skip(_WHY)
    from ltpx.dataplane.rig.star import Rig, RigConfig
    with Rig(RigConfig(name=f"m{_TAG}", workers=3, rate_bps=10**9, buffer_bytes=30_000)) as r:
        yield r


def _py(rig, host, code: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run Python `code` in `host`'s namespace (a Host: any of its devices')."""
    r = rig.exec(host, [sys.executable, "-c", textwrap.dedent(code), *args], timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r


@privileged
@pytest.mark.rig
def test_hosts_reach_the_ps_and_each_other(rig):
    # TCP from every worker to the PS
    ls = rig.socket(rig.ps, socket.AF_INET, socket.SOCK_STREAM)
    ls.bind((rig.ps.ip, 7001))
    ls.listen(16)
    ls.settimeout(5)
    for w in rig.workers:
        _py(rig, w, """
            import socket, sys
            s = socket.create_connection((sys.argv[1], 7001), timeout=5)
            s.sendall(sys.argv[2].encode()); s.close()
            """, rig.ps.ip, w.name)
    got = set()
    for _ in rig.workers:
        c, (addr, _port) = ls.accept()
        c.settimeout(5)
        got.add((addr, c.recv(100).decode()))
        c.close()
    ls.close()
    assert got == {(w.ip, w.name) for w in rig.workers}
    # UDP worker -> worker and PS -> worker
    w0, w1 = rig.workers[0], rig.workers[1]
    rx = rig.socket(w1)
    rx.bind((w1.ip, 7002))
    rx.settimeout(5)
    for src in (w0, rig.ps):
        _py(rig, src, """
            import socket, sys
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"hi", (sys.argv[1], 7002))
            """, w1.ip)
        data, (addr, _port) = rx.recvfrom(100)
        assert (data, addr) == (b"hi", src.ip)
    rx.close()


@privileged
@pytest.mark.rig
def test_nothing_outside_the_rig_is_reachable(rig):
    for h in (rig.ps, rig.workers[0]):
        r = rig.exec(h, ["ip", "-4", "route", "show", "table", "all"])
        routes = [ln for ln in r.stdout.splitlines() if ln and not ln.startswith(("local", "broadcast"))]
        assert routes and all(ln.startswith("198.18.0.0/24") for ln in routes), r.stdout
        assert "default" not in r.stdout
        for dst in ("10.1.2.3", "8.8.8.8", "198.20.0.1", "192.0.2.1"):
            s = rig.socket(h, socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(2)
            t = time.monotonic()
            try:
                with pytest.raises(OSError) as e:
                    s.connect((dst, 80))
            finally:
                s.close()
            assert e.value.errno == errno.ENETUNREACH and time.monotonic() - t < 0.5
    names = _root_links()
    assert not [n for n in names if n.startswith(("sw-", "ltp-ps", "ltp-w"))]


_SENDER = """
import socket, sys
dst, n = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(n):
    s.sendto(b"x" * 18, (dst, 9))
"""


@privileged
@pytest.mark.rig
def test_loss_injector_drop_fraction(rig):
    sink = rig.socket(rig.ps)
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sink.bind((rig.ps.ip, 9))
    try:
        n = 25_000
        rig.set_loss(0.0)
        c0 = rig.loss_counters()
        _py(rig, rig.workers[0], _SENDER, rig.ps.ip, str(n))
        c1 = rig.loss_counters()
        assert c1["dropped"] == c0["dropped"]
        assert c1["passed"] - c0["passed"] >= n

        rig.set_loss(0.05)
        assert abs(rig.get_loss() - 0.05) < 1e-6
        _py(rig, rig.workers[1], _SENDER, rig.ps.ip, str(n))
        c2 = rig.loss_counters()
        dropped, passed = c2["dropped"] - c1["dropped"], c2["passed"] - c1["passed"]
        assert dropped + passed >= 20_000
        assert 0.04 <= dropped / (dropped + passed) <= 0.06, (dropped, passed)
    finally:
        rig.set_loss(0.0)
        sink.close()


@privileged
@pytest.mark.rig
def test_loss_injector_never_drops_arp(rig):
    """Non-IPv4-UDP/TCP frames (here: ARP requests, unicast to the PS as a
    neighbour's refresh is: the switch floods no broadcast to a server's
    port) pass and count as "other"."""
    w = rig.workers[2]
    rig.set_loss(0.99)
    try:
        c0 = rig.loss_counters()
        _py(rig, w, """
            import socket, sys
            mac = bytes.fromhex(sys.argv[2].replace(":", ""))
            ip = socket.inet_aton(sys.argv[3]); ps = socket.inet_aton(sys.argv[4])
            dst = bytes.fromhex(sys.argv[5].replace(":", ""))
            arp = (dst + mac + b"\\x08\\x06" + b"\\x00\\x01\\x08\\x00\\x06\\x04\\x00\\x01"
                   + mac + ip + b"\\x00" * 6 + ps)
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
            s.bind((sys.argv[1], 0))
            for _ in range(200):
                s.send(arp)
            """, w.ifname, w.mac, w.ip, rig.ps.ip, rig.ps.mac)
        time.sleep(0.1)
        c1 = rig.loss_counters()
        assert c1["other"] - c0["other"] >= 200
        assert c1["dropped"] == c0["dropped"]
    finally:
        rig.set_loss(0.0)


@privileged
@pytest.mark.root
def test_rig_status_with_no_rig_up_says_so_and_succeeds():
    """`ltp rig status` where no rig is up (a mount namespace of its own, with
    empty folders over where rigs leave traces: state files, network
    namespaces, pins; so rigs of other tests stay out of sight): a line
    saying so and how to build one, exit 0; -j: an empty list."""
    cmd = [str(LTP)] if LTP.exists() else [sys.executable, "-m", "ltpx.tools.cli"]
    hide = " && ".join(f"mkdir -p {d} && mount -t tmpfs ltp-none {d}"
                       for d in ("/run/ltp", "/run/netns"))
    pins = " ; ".join(f"if [ -d {d} ]; then mount -t tmpfs ltp-none {d}; fi"
                      for d in ("/sys/fs/bpf/ltp-rig", "/sys/fs/bpf/ltp-ls"))
    script = (f"{hide} && {pins} ; "
              f"{' '.join(cmd)} rig status && {' '.join(cmd)} rig status -j")
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    text, js = r.stdout.splitlines()
    assert text.startswith("no rig is up") and "ltp rig up" in text
    assert json.loads(js) == {"rigs": []}
    assert "error" not in r.stderr


@privileged
@pytest.mark.rig
def test_other_process_sees_the_rig(rig):
    """State file and pinned maps: `ltp rig status` in another process reads
    the hosts and the same counters; `Rig.attach` can change the loss."""
    from ltpx.dataplane.rig.star import Rig
    r = _ltp("rig", "status", "--name", rig.name, "-j")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert len(st["hosts"]) == 1 + len(rig.workers)
    assert {h["role"] for h in st["hosts"]} == {"ps", "worker"}
    assert st["loss_injector"]["dropped"] == rig.loss_counters()["dropped"]
    assert st["bottleneck"][0]["rate_bps"] == 10**9 and st["bottleneck"][0]["present"]
    other = Rig.attach(rig.name)
    try:
        other.set_loss(0.25)
        assert abs(rig.get_loss() - 0.25) < 1e-6
    finally:
        other.set_loss(0.0)
        other.close()
    with Rig.attach(rig.name):
        pass                                  # leaving an attached rig keeps it
    assert Rig.exists(rig.name)
    r = _ltp("rig", "exec", "--name", rig.name, "w0", "--", "ip", "-br", "addr")
    assert r.returncode == 0 and rig.workers[0].ip in r.stdout


@privileged
@pytest.mark.rig
def test_tcp_incast_reports_its_keys(rig):
    from ltpx.control.bench.tcp import run_tcp_incast
    res = run_tcp_incast(rig, size=64 * 1024, rounds=3, cc="cubic")
    for k in ("median_s", "p99_s", "max_s", "limit_s", "median_over_limit", "p99_over_limit",
              "cc", "workers", "size_bytes", "rounds"):
        assert k in res
    assert res["rounds"] == 3 and res["workers"] == 3 and res["size_bytes"] == 65536
    assert res["limit_s"] == pytest.approx(3 * 65536 * 8 / 1e9)
    assert res["median_s"] >= res["limit_s"] * 0.9


@privileged
@pytest.mark.rig
def test_host_veths_take_native_xdp(rig):
    """A host's veth accepts a native-mode XDP program (MTU 1500, peer has
    XDP_PASS) and traffic still flows through it."""
    from ltpx.dataplane.xdp import loader
    h, ps = rig.workers[0], rig.ps
    loader.attach_pass(h.ifname, h.netns, "native")
    loader.attach_pass(ps.ifname, ps.netns, "native")
    try:
        rx = rig.socket(ps)
        rx.bind((ps.ip, 7003))
        rx.settimeout(5)
        _py(rig, h, """
            import socket, sys
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"xdp", (sys.argv[1], 7003))
            """, ps.ip)
        assert rx.recvfrom(10)[0] == b"xdp"
        rx.close()
        r = rig.exec(h, ["ip", "link", "show", "dev", h.ifname])
        assert "xdp " in r.stdout or "xdpdrv" in r.stdout, r.stdout
    finally:
        loader.detach(h.ifname, h.netns, "native")
        loader.detach(ps.ifname, ps.netns, "native")


@pytest.mark.unit
def test_cli_limits_mirror_the_rig():
    """tools/flags.py keeps the rig's limits import-free for `ltp -h`: they must agree."""
    from ltpx.dataplane.rig import star
    from ltpx.tools import flags
    assert flags.MAX_WORKERS == star.MAX_WORKERS
    assert flags.DEFAULT_RIG == star.DEFAULT_NAME


@privileged
@pytest.mark.rig
def test_skb_mode_rounds_arrive_whole():
    """Switch ports cut UDP GSO batches into datagrams, as a NIC would: a
    generic-mode (skb) XDP program behind a veth otherwise sees one oversized
    frame per batch, drops it as malformed, and a loss-free round closes by
    deadline with a quarter of it missing. Early Close waits for every chunk
    here (threshold 1): no loss is configured, but the 60 KB queue may drop
    a burst when a busy CPU stalls a pacer, and the default rule may then
    rightly cut a round at 98 % (it did once, under load)."""
    from ltpx.control.bench.cluster import LtpCluster
    from ltpx.control.transport.early_close import EarlyCloseConfig
    from ltpx.dataplane.rig.star import Rig, RigConfig
    whole = EarlyCloseConfig(threshold_min=1.0, threshold_max=1.0, min_deadline_s=2.0)
    with Rig(RigConfig(name=f"g{_TAG}", workers=2, mode="skb", rate_bps=10**9,
                       buffer_bytes=60_000)) as rig, \
            LtpCluster(rig, 65536, mode="skb", early_close=whole) as cl:
        for r in range(2):
            res, _ = cl.run_round(r, 65536)
            assert res.delivered_fraction == 1.0, res.report()
        assert cl.ps.counters()["malformed"] == 0


@privileged
@pytest.mark.rig
def test_a_nodes_devices_share_one_link_and_talk_among_themselves_off_it():
    # 2 nodes of 2 workers, a server beside each: every host its own device,
    # a node's devices behind one link each way (the IFBs' TBFs count them)
    from ltpx.dataplane.rig.star import Rig, RigConfig
    cfg = RigConfig(name=f"nd{_TAG}", workers=4, servers=4, nodes=2, colocate=True,
                    shape="all", loss_on="all")
    with Rig(cfg) as rig:
        def links() -> dict[str, int]:
            return {b["port"]: b["packets"] for b in rig.bottleneck() if b["port"][0] == "n"}

        def send(src: str, dst: str, n: int = 50) -> int:   # 50 frames: within a queue
            """n datagrams from device src to device dst; how many arrived."""
            d = devices[dst]
            rx = rig.socket(d)
            rx.bind((d.ip, 7010))
            rx.settimeout(0.5)
            _py(rig, devices[src], """
                import socket, sys
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                for _ in range(int(sys.argv[2])):
                    s.sendto(b"x" * 100, (sys.argv[1], 7010))
                """, d.ip, str(n))
            got = 0
            with contextlib.suppress(socket.timeout):
                while rx.recv(200):
                    got += 1
            rx.close()
            return got

        devices = {h.name: h for h in rig.hosts}
        assert [sorted(h.name for h in rig.node_devices(k)) for k in (0, 1)] == \
            [["ps", "ps1", "w0", "w1"], ["ps2", "ps3", "w2", "w3"]]
        before = links()
        assert send("w0", "w2") == 50                # across: up node 0's link, down node 1's
        after = links()
        assert after["n0-up"] - before["n0-up"] == 50 == after["n1-down"] - before["n1-down"]
        assert after["n0-down"] == before["n0-down"] and after["n1-up"] == before["n1-up"]
        rig.set_loss(0.9)                            # the wire's loss, not the node's own switch
        assert send("w0", "w1") == 50 and send("ps1", "w0") == 50
        assert links() == after
        assert send("w0", "w3") < 25                 # ... which across the wire applies


def _rig_up(rig) -> bool:
    from ltpx.dataplane import netns
    return all(netns.exists(ns) for ns in rig.namespaces)


@privileged
@pytest.mark.rig
def test_a_kept_rig_without_nodes_is_refused_for_ranks_that_need_a_device_each(rig):
    # over LTP, ranks on one node or a server beside each worker need a rig
    # with nodes: on this one they would share a device's one XDP program
    for argv, needle in [(["launch", "--rig", rig.name, "--workers", "3", "--colocate", "-j",
                           "--", "true"], "has no nodes"),
                         (["train", "--name", rig.name, "--workers", "3", "--colocate", "-j"],
                          "no server beside each worker")]:
        r = _ltp(*argv)
        assert r.returncode == 2, (r.stdout, r.stderr[-2000:])
        assert needle in json.loads(r.stdout)["error"]
    assert _rig_up(rig)            # the rig the refusals named is untouched
