# SPDX-License-Identifier: Apache-2.0
"""`ltp load/unload/status`: the real CLI as subprocesses (flows, top and
capture are in test_cli_flows.py; the shared parts in ltp_cli.py).

One rig (PS + 2 workers) serves the module; its PS program is loaded by
`ltp load`. Tests run in file order: the last ones replace and unload what
the first ones loaded. They unload only in the rig's namespaces, so programs
other test runs load at the same time stay.
"""
from __future__ import annotations

import json
import os

import pytest

from conftest import requires_bpf
from ltp_cli import CHUNK, JOB, ltp, ltp_json, ours, rig_fixtures, width
from ltpx.dataplane.xdp import wire as W
from ltpx.dataplane.xdp.maps import MAP_NAMES

RIG = f"ops{os.getpid() % 100000}"
requires_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


# --------------------------------------------------------------------------- no rig needed

@pytest.mark.root
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
    (["train", "--colocate", "--servers", "3"], "leave out --servers 3"),
    (["train", "--colocate", "--workers", "9"], "at most 8 servers"),
    (["train", "--colocate", "--compare", "ltp:servers=1"], "servers=1"),
    (["train", "--workers", "4", "--ranks-per-node", "3"], "divide --workers (4)"),
    (["train", "--ranks-per-node", "0"], "--ranks-per-node"),
    (["train", "--share-nic", "--colocate", "--restart"], "not with --colocate --share-nic"),
    (["train", "--share-nic", "--colocate", "--kill", "server:0@3"], "no server ranks"),
    (["train", "--share-nic", "--colocate", "--loss-policy", "defer"], "loss_policy defer"),
    (["capture", "eth9", "-r", "x.pcap"], "DEV"),
    (["top", "--interval", "0"], "--interval"),
    (["top", "-c", "0"], "--count"),
    (["bench", "incast", "--rate", "40gbit"], "--rate"),     # past what TBF shapes
    (["bench", "incast", "--rate", "1e400"], "--rate"),      # inf: no traceback
    (["bench", "incast", "--size", "nan"], "--size"),
])
def test_usage_errors_exit_2_with_json_errors(argv, needle):
    err = json.loads(ltp(*argv, "-j", rc=2).stdout)
    assert err["exit_code"] == 2 and needle in err["error"]
    p = ltp(*argv, rc=2)
    assert needle in p.stderr and "Traceback" not in p.stderr


@pytest.mark.root
@pytest.mark.parametrize("flags,needle", [
    (["--colocate", "--transport", "tcp", "--servers", "3"], "leave out --servers 3"),
    (["--colocate", "--servers", "3"], "leave out --servers 3"),              # over LTP too
    (["--workers", "3", "--ranks-per-node", "2", "--transport", "tcp"], "divide --workers"),
    (["--workers", "3", "--ranks-per-node", "2"], "divide --workers"),
    (["--workers", "9", "--colocate", "--transport", "tcp"], "at most 8 servers"),
    (["--colocate", "--share-nic", "--transport", "tcp"], "over LTP only"),
])
def test_launch_shape_usage_errors(flags, needle):
    err = json.loads(ltp("launch", *flags, "-j", "--", "true", rc=2).stdout)
    assert err["exit_code"] == 2 and needle in err["error"]


@pytest.mark.root
def test_version_is_the_package_version():
    import ltpx
    assert ltp("--version").stdout == f"ltp {ltpx.__version__}\n"


@pytest.mark.root
@pytest.mark.parametrize("cmd", ["status", "flows", "top", "exporter"])
def test_a_namespace_that_does_not_exist_exits_1(cmd):
    argv = [cmd, "--netns", f"ltp-{RIG}-nosuchns"] + (["-c", "1"] if cmd == "top" else [])
    err = json.loads(ltp(*argv, "-j", rc=1).stdout)
    assert err == {"error": f"no network namespace 'ltp-{RIG}-nosuchns' (`ip netns list` "
                            "shows them)", "exit_code": 1}
    assert "no network namespace" in ltp(*argv, rc=1).stderr


@pytest.mark.unit
def test_status_table_fits_80_columns_and_keeps_every_column():
    """Long names give way (ending in "…"); the other columns keep their width."""
    import io

    from rich.console import Console

    from ltpx.tools.cmd_ops import status_text
    base = dict(mode="native", prog_id=1234567, pinned_prog_id=1234567, role="worker",
                job=0xDEADBEEF, maps=len(MAP_NAMES), maps_pinned=len(MAP_NAMES),
                maps_expected=len(MAP_NAMES), state="ok")
    rows = [dict(base, netns="ltp-a-rather-long-namespace-name", dev="averylongdevnam"),
            dict(base, netns="[red]ns", dev="eth0", maps=3, maps_pinned=3, state="no netns")]
    out = io.StringIO()
    Console(file=out, width=80).print(status_text(rows))
    lines = out.getvalue().splitlines()
    assert max(len(x) for x in lines) <= 80
    assert lines[0].split() == ["NAMESPACE", "DEVICE", "MODE", "PROG", "ROLE", "JOB", "MAPS",
                                "STATE"]
    assert lines[1].split()[0].endswith("…")
    assert lines[1].split()[2:] == ["native", "1234567", "worker", "0xdeadbeef",
                                    str(len(MAP_NAMES)), "ok"]
    assert lines[2].split() == ["[red]ns", "eth0", "native", "1234567", "worker", "0xdeadbeef",
                                f"3/{len(MAP_NAMES)}", "no", "netns"]     # no markup read
    # a rank in a seat of a shared device's mux: DEV:PORT
    out = io.StringIO()
    Console(file=out, width=80).print(status_text([dict(base, netns="ns", dev="eth0",
                                                        seat_port=7411, state="dead")]))
    assert out.getvalue().splitlines()[1].split()[:2] == ["ns", "eth0:7411"]


@pytest.mark.root
@requires_root
def test_missing_bcc_names_the_fix(tmp_path):
    fake = tmp_path / "bcc"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    p = ltp("load", "eth9", "--role", "ps", "--workers", "2", rc=1, env=env)
    assert "bcc is not importable" in p.stderr and "ltp doctor --fix" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- on a rig

rig, loaded = rig_fixtures(RIG)


@pytest.mark.rig
@requires_bpf
def test_load_then_status_lists_exactly_it(rig, loaded):
    from ltpx.dataplane.xdp import registry
    assert (loaded["role"], loaded["job"], loaded["mode"], loaded["netns"], loaded["dev"]) == \
        ("ps", JOB, "native", rig.ps.netns, rig.ps.ifname)
    assert loaded["geometry"] == {"slots": 2, "max_chunks": 64, "chunk_bytes": CHUNK, "banks": 2,
                                  "port": W.PORT, "stride": 1}
    assert loaded["peers"] == {"0": 0, "1": 1}
    att = registry.xdp_on(rig.ps.ifname, rig.ps.netns)
    assert att == {"prog_id": loaded["prog_id"], "mode": "native"}
    assert os.path.isdir(loaded["pin_dir"]) and os.path.exists(loaded["record"])

    rows = ours(rig, ltp_json("status"))
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


@pytest.mark.rig
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


@pytest.mark.rig
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
    rows = ours(rig, ltp_json("status"))
    assert sorted((r["dev"], r["role"], r["prog_id"], r["state"]) for r in rows) == sorted(
        [(rig.ps.ifname, "ps", new["prog_id"], "ok"), (w1.ifname, "worker", wk["prog_id"], "ok")])

    # --all in each of the rig's namespaces: a bare --all would also unload
    # what other runs on this machine loaded meanwhile
    gone = [g for ns in rig.namespaces for g in ltp_json("unload", "--all", "--netns", ns)]
    assert sorted((g["netns"], g["dev"]) for g in gone) == sorted(
        [(rig.ps.netns, rig.ps.ifname), (w1.netns, w1.ifname)])
    assert all(g["detached"] for g in gone)
    assert registry.xdp_on(rig.ps.ifname, rig.ps.netns) is None
    assert registry.xdp_on(w1.ifname, w1.netns) is None
    for ns in rig.namespaces:
        assert registry.entries(ns) == []
        assert not os.path.exists(os.path.join(registry.PIN_ROOT, ns))
        assert not os.path.exists(os.path.join(registry.RECORD_ROOT, ns))
    assert ours(rig, ltp_json("status")) == []
    assert ltp_json("flows", "--netns", rig.ps.netns) == []
    assert "nothing to unload" in ltp("unload", "--all", "--netns", rig.ps.netns).stdout


@pytest.mark.rig
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
