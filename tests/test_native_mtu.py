# SPDX-License-Identifier: Apache-2.0
"""A native XDP attach that a device's MTU refuses says so: the MTU, what
native XDP takes and the two ways out (a veth pair of MTU 9000, a real
attach). The error for a device of a usual MTU points at generic mode."""
from __future__ import annotations

import os

import pytest

from conftest import requires_bpf
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
