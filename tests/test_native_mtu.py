# SPDX-License-Identifier: Apache-2.0
"""A native XDP attach that a device's MTU refuses says so: the MTU, what
native XDP takes and the two ways out (a veth pair of MTU 9000, a real
attach). The error for a device of a usual MTU points at generic mode.
`ltp doctor --dev` tells the same before anything is attached, and an
LTP_MTU over the device's."""
from __future__ import annotations

import os

import pytest

from conftest import requires_bpf
from ltp_cli import ltp, ltp_json
from ltpx.dataplane.doctor.checks import device_check
from ltpx.dataplane.rig.netlink import iproute
from ltpx.dataplane.rig.pair import VethPair
from ltpx.dataplane.xdp import loader, lookup
from ltpx.errors import DataplaneError

PREFIX = f"ltpmt{os.getpid() % 100000}"


def set_mtu(end, mtu: int) -> None:
    with iproute(end.ns) as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname=end.dev)[0], mtu=mtu)


@pytest.fixture
def jumbo():
    with VethPair(PREFIX) as p:
        for end in (p.a, p.b):
            set_mtu(end, 9000)
        yield p


@requires_bpf
@pytest.mark.rig
def test_a_native_attach_over_a_jumbo_mtu_names_the_mtu_and_the_ways_out(jumbo):
    dev, ns = jumbo.a.dev, jumbo.a.ns
    assert lookup.mtu(dev, ns) == 9000
    with pytest.raises(DataplaneError) as e:
        loader.attach_pass(dev, ns, "native")
    msg = str(e.value)
    assert f"{dev}'s MTU is 9000" in msg
    assert f"ip link set {dev} mtu 3500" in msg and "LTP_XDP_MODE=skb" in msg
    assert lookup.xdp_on(dev, ns) is None          # nothing left attached
    loader.attach_pass(dev, ns, "skb")              # the way out it names works
    assert lookup.xdp_on(dev, ns)["mode"] == "skb"


@pytest.mark.rig
def test_the_hint_reads_the_device_mtu_and_a_missing_device_is_no_error(jumbo):
    set_mtu(jumbo.b, 1500)
    assert "LTP_XDP_MODE=skb attaches in generic mode" in loader.native_hint(jumbo.b.dev,
                                                                             jumbo.b.ns)
    assert "MTU" not in loader.native_hint(jumbo.b.dev, jumbo.b.ns)
    assert lookup.mtu("zz0", jumbo.a.ns) is None
    assert "MTU" not in loader.native_hint("zz0", jumbo.a.ns)
    set_mtu(jumbo.b, 3200)       # under veth's limit, over some drivers': no advice to raise it
    hint = loader.native_hint(jumbo.b.dev, jumbo.b.ns)
    assert "MTU is 3200" in hint and "about 3000" in hint and "mtu 3500" not in hint


@pytest.mark.rig
def test_the_doctor_checks_a_device_mtu_against_native_xdp_and_ltp_mtu(jumbo):
    a, b = jumbo.a, jumbo.b
    bad = device_check(a.dev, a.ns, ltp_mtu=1500, mode="native")
    assert not bad.ok and f"{a.dev}'s MTU is 9000" in bad.detail
    assert f"ip link set {a.dev} mtu 3500" in bad.fix and "LTP_XDP_MODE=skb" in bad.fix
    assert device_check(a.dev, a.ns, ltp_mtu=9000, mode="skb").ok      # generic mode takes it
    set_mtu(b, 1500)
    over = device_check(b.dev, b.ns, ltp_mtu=3500)
    assert not over.ok and "LTP_MTU 3500 is over" in over.detail
    assert over.fix.startswith("LTP_MTU=1500 ")
    good = device_check(b.dev, b.ns, ltp_mtu=1500)
    assert good.ok and "chunks of 1432 bytes" in good.detail     # 1500 less 68 header bytes


@pytest.mark.root
def test_ltp_doctor_dev_names_a_missing_device_and_is_not_ready():
    out = ltp_json("doctor", "--no-load", "--dev", "zz-nodev0", rc=1)
    dev = [c for c in out["checks"] if c["name"] == "device"]
    assert not out["ok"] and len(dev) == 1 and not dev[0]["ok"]
    assert "no device 'zz-nodev0'" in dev[0]["detail"] and "LTP_DEV" in dev[0]["fix"]


@pytest.mark.root
def test_ltp_doctor_dev_refuses_a_bad_ltp_mtu_as_a_usage_error():
    p = ltp("doctor", "--no-load", "--dev", "lo", rc=2,
            env={**os.environ, "LTP_MTU": "abc"})
    assert "LTP_MTU" in p.stderr and "Traceback" not in p.stderr
