# SPDX-License-Identifier: Apache-2.0
"""Checksums verified by default where frames carry whole ones (issue 26).

The XDP program can verify each DATA frame's UDP checksum
(tests/test_xdp_trust.py checks what it refuses). Frames from a NIC carry
whole sums; frames from a socket on this host, over a veth or loopback,
carry the sum unfinished (left to offload), so an endpoint verifies by
default exactly where its device is neither (dataplane/xdp/lookup.py,
csum_complete). Here on real devices in namespaces this test makes: a veth
pair, loopback, and an ifb device standing in for a NIC (this kernel has no dummy).
"""
from __future__ import annotations

import os

import pytest

from conftest import requires_bpf
from ltpx.dataplane.rig.netlink import iproute
from ltpx.dataplane.rig.pair import VethPair
from ltpx.dataplane.xdp import lookup
from ltpx.errors import RegistryError

PREFIX = f"ltpcs{os.getpid() % 100000}"
NIC_IP = "198.18.251.1"


@pytest.fixture(scope="module")
def pair():
    with VethPair(PREFIX) as p:
        with iproute(p.a.ns) as ipr:       # a device of no host-local kind (ifb): a NIC's stand-in
            ipr.link("add", ifname="n0", kind="ifb")
            idx = ipr.link_lookup(ifname="n0")[0]
            ipr.addr("add", index=idx, address=NIC_IP, prefixlen=24)
            ipr.link("set", index=idx, state="up")
        yield p


@pytest.mark.rig
def test_whole_checksums_are_told_by_the_device_kind(pair):
    assert not lookup.csum_complete(pair.a.dev, pair.a.ns)       # a veth
    assert not lookup.csum_complete("lo", pair.a.ns)
    assert lookup.csum_complete("n0", pair.a.ns)
    with pytest.raises(RegistryError, match="no device 'zz0'"):
        lookup.csum_complete("zz0", pair.a.ns)


@requires_bpf
@pytest.mark.rig
def test_an_endpoint_verifies_checksums_by_default_where_frames_carry_them(pair):
    """Endpoint(verify_csum=None), the default of every rank: off on the
    veth, on on the NIC's stand-in; an explicit choice wins; the XDP
    program's setting is what the endpoint says."""
    from ltpx.control.transport import Endpoint
    from ltpx.control.trust import tokens
    secret = tokens.new_secret()
    cases = [(pair.a.dev, pair.a.ip, "native", None, False),
             ("n0", NIC_IP, "skb", None, True),
             (pair.a.dev, pair.a.ip, "native", True, True),
             ("n0", NIC_IP, "skb", False, False)]
    for dev, ip, mode, given, want in cases:
        ep = Endpoint(dev, ip, {0: 0}, 1000, ns=pair.a.ns, mode=mode, secret=secret,
                      publish=False, verify_csum=given)
        try:
            assert ep.verify_csum is want, (dev, given)
            assert ep.maps.verify_csum() is want, (dev, given)
        finally:
            ep.close()


@pytest.fixture(scope="module")
def nic_rig():
    """A star rig of 2 workers whose switch finishes each frame's checksum
    on its way to a host, as a NIC does before the wire: every host's
    program sees whole sums, so verification can be on everywhere."""
    from conftest import star_rig
    from ltpx.dataplane.rig import netlink
    for rig in star_rig(name="csr", workers=2, loss=0.0, loss_on="all"):
        for h in rig.hosts:
            netlink.whole_checksums(rig.switch_ns, h.port)
        yield rig


@requires_bpf
@pytest.mark.rig
@pytest.mark.parametrize("sender", ["socket", "xdp"])
def test_rounds_and_group_answers_complete_with_checksums_verified(nic_rig, sender):
    """Checksums verified on every rank (forced on: the rig's ports are
    veths) over frames that carry whole sums: uplink rounds complete and a
    GROUP answer (sent once, to the broadcast address, then rewritten by
    each worker's program to its own id) reaches every worker bit-exact,
    with not one frame failing its sum on any host (a GROUP frame whose sum
    the rewrite broke would be counted bad_csum and only its repairs land)."""
    import hashlib

    import numpy as np

    from ltpx.control.bench.cluster import LtpCluster, worker_tensor
    from ltpx.control.transport.early_close import EarlyCloseConfig
    nel = 20_000
    full = EarlyCloseConfig(threshold_min=1.0, threshold_max=1.0, min_deadline_s=5.0,
                            hard_timeout_s=10.0)
    with LtpCluster(nic_rig, nel, checksums="on", sender=sender, early_close=full) as cl:
        assert cl.ps.verify_csum and cl.ps.maps.verify_csum()
        for r in (1, 2):
            res, _ = cl.run_round(r, nel, seed=3)
            assert res.reason == "complete"
            want = np.stack([worker_tensor(3, w, r, nel) for w in cl.ids])
            assert np.array_equal(res.values, want)
        params = np.random.default_rng(5).standard_normal(nel).astype(np.float32)
        rep, digests = cl.downlink(3, params, group=True)
        assert digests == dict.fromkeys(cl.ids, hashlib.sha256(params.tobytes()).hexdigest())
        assert cl.last_csum == dict.fromkeys(cl.ids, (True, 0))
        assert cl.ps.maps.counters()["bad_csum"] == 0
