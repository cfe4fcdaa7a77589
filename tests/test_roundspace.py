# SPDX-License-Identifier: Apache-2.0
"""One device for a sharded worker: server s's rounds r·S + s on the wire,
two banks each (control/transport/roundspace.py), the tokens from each
server's own secret (ShardTokens), and a worker's links to S servers
sharing one endpoint (link_ltp_worker.SharedDevice) on a real rig."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from conftest import requires_bpf


@pytest.mark.unit
@pytest.mark.parametrize("S", [1, 2, 3, 8])
def test_every_server_keeps_two_banks_of_its_own(S):
    from ltpx.control.transport.roundspace import RoundSpace, banks_for
    banks = banks_for(S)
    seen: dict[int, set] = {}
    for s in range(S):
        view = RoundSpace(None, s, S)
        for r in range(40):
            seen.setdefault(view.wire(r) % banks, set()).add(s)
        # two rounds in a row never share a bank: one is read while the next fills
        assert all(view.wire(r) % banks != view.wire(r + 1) % banks for r in range(40))
    assert sorted(seen) == list(range(banks))
    assert all(len(owners) == 1 for owners in seen.values())     # no bank is two servers'
    assert [RoundSpace(None, 0, 1).wire(r) for r in range(3)] == [0, 1, 2]   # S = 1: as it was


@pytest.mark.unit
def test_a_deferred_answers_memo_stays_keyed_by_the_servers_own_rounds():
    """defer.push keeps each answer's verdict under its wire round and asks
    for the one before it (wire - 1): through a view both are the server's
    rounds r and r - 1, so its link prunes the memo by its own numbers."""
    from ltpx.control.transport.roundspace import RoundSpace, _ByRound
    memo: dict = {}
    view = RoundSpace(None, 2, 3)
    by = _ByRound(memo, view)
    by[view.wire(7)] = "v7"
    assert memo == {7: "v7"} and by[view.wire(7)] == "v7"
    assert by.get(view.wire(8) - 1) == "v7" and by.get(view.wire(7) - 1) is None
    assert by.get(view.wire(6), "none") == "none"


@pytest.mark.unit
def test_bad_shapes_are_refused():
    from ltpx.control.transport.endpoint_config import EndpointConfig
    from ltpx.control.transport.roundspace import RoundSpace, banks_for
    from ltpx.dataplane.xdp.mapstructs import Geometry
    with pytest.raises(ValueError, match="shard 2 is not one of 2"):
        RoundSpace(None, 2, 2)
    with pytest.raises(ValueError, match="servers must be in 1..8"):
        banks_for(9)
    with pytest.raises(ValueError, match="banks must be even"):
        Geometry(banks=3)
    with pytest.raises(ValueError, match="stride must be in 1..8"):
        Geometry(stride=9)
    with pytest.raises(ValueError, match="needs banks a multiple"):
        EndpointConfig(secret=[b"k" * 16] * 3, banks=4)


@pytest.mark.unit
def test_a_shared_endpoints_tokens_are_each_servers_own():
    """Round r·S + s is server s's: its tokens are the ones server s's own
    endpoint (one secret) derives for that wire round, so no server can
    make another's."""
    from ltpx.control.trust import tokens
    S, job = 3, 7
    secrets = [tokens.new_secret() for _ in range(S)]
    shared = tokens.for_rounds(secrets, job, self_id=4)
    for s in range(S):
        own = tokens.for_rounds(secrets[s], job, self_id=4)
        server = tokens.for_rounds(secrets[s], job)
        for r in range(3):
            wire = r * S + s
            assert shared.send(wire, 4) == own.send(wire, 4) == server.receive(wire, 4)
            assert shared.receive(wire, 4) == server.send(wire, 4)
            assert shared.group(wire) == server.group(wire)
            other = tokens.for_rounds(secrets[(s + 1) % S], job)
            assert other.receive(wire, 4) != shared.send(wire, 4)
    with pytest.raises(ValueError, match="all be given or all be None"):
        tokens.for_rounds([secrets[0], None], job, self_id=4)


@pytest.fixture(scope="module")
def two_servers():
    from conftest import star_rig
    yield from star_rig(clear=True, name="rsp", workers=2, servers=2, mode="skb")


@requires_bpf
@pytest.mark.rig
def test_a_worker_reaches_two_servers_through_its_one_device(two_servers, capsys):
    """Two workers, two servers, one device a worker: each worker's links
    share one endpoint; both push their slices to both servers at once
    (two threads), each server sums only its own, and both servers' group
    answers reach each worker whole. An error names the op's round beside
    the wire's. A larger op remakes the shared endpoint once, for both
    links."""
    from ltpx.control.torchapi.link_ltp import LtpServerLink
    from ltpx.control.torchapi.link_ltp_worker import LtpWorkerLink, SharedDevice
    from ltpx.control.torchapi.settings import Settings
    from ltpx.control.trust import tokens
    from ltpx.dataplane.rig.star import BROADCAST
    from ltpx.dataplane.xdp import flows, registry
    rig, S, n = two_servers, 2, 30_000
    secrets = [tokens.new_secret() for _ in range(S)]

    def settings(h):
        return Settings(dev=h.ifname, ip=h.ip, netns=h.netns, xdp_mode=rig.config.mode,
                        mtu=rig.config.mtu, timeout=20, job=11, servers=S)
    servers = [LtpServerLink(settings(h), 2, BROADCAST, secret=secrets[i], shard=i, servers=S)
               for i, h in enumerate(rig.servers)]
    devices = [SharedDevice(settings(h), w, 2, secrets, S) for w, h in enumerate(rig.workers)]
    links = [[LtpWorkerLink(settings(h), w, 2, secret=secrets[i], device=devices[w], shard=i)
              for i in range(S)] for w, h in enumerate(rig.workers)]
    try:
        for i, sv in enumerate(servers):
            sv.connect({w: {"ip": h.ip} for w, h in enumerate(rig.workers)})
            sv.ensure(n)
            for w in range(2):
                links[w][i].connect({**sv.address(), "ip": rig.servers[i].ip})
                links[w][i].ensure(n)
        for w in range(2):
            assert links[w][0].ep.ep is links[w][1].ep.ep is devices[w].ep   # one endpoint
        rng = np.random.default_rng(3)
        grads = rng.standard_normal((2, S, n)).astype(np.float32)   # [worker][server]
        for sv in servers:
            sv.log = True                                            # LTP_ROUND_LOG
        for r in (5, 6):                                             # two rounds: both banks
            for sv in servers:
                sv.open(r, n, [0, 1], reliable=True)
            pushers = [threading.Thread(target=links[w][i].push, args=(r, grads[w, i], True))
                       for w in range(2) for i in range(S)]
            for t in pushers:
                t.start()
            got = [sv.gather(r, n, [0, 1]) for sv in servers]
            for t in pushers:
                t.join()
            for i, g in enumerate(got):
                assert np.array_equal(np.asarray(g.values)[:, :n], grads[:, i]), (r, i)
        logged = [json.loads(line)["round_log"] for line in capsys.readouterr().err.splitlines()
                  if line.startswith('{"round_log"')]
        assert sorted((x["server"], x["round"], x["wire_round"]) for x in logged) == \
            [(0, 5, 10), (0, 6, 12), (1, 5, 11), (1, 6, 13)]     # the op's round, and r·S + s
        answers = rng.standard_normal((S, n)).astype(np.float32)
        for w in range(2):
            for i in range(S):
                links[w][i].expect(9, n)
        senders = [threading.Thread(target=sv.send, args=(9, answers[i], True))
                   for i, sv in enumerate(servers)]
        for t in senders:
            t.start()
        for w in range(2):
            for i in range(S):
                out = np.zeros(n, np.float32)
                links[w][i].pull(9, out)
                assert np.array_equal(out, answers[i]), (w, i)
        for t in senders:
            t.join()
        for w in range(2):
            counts = devices[w].ep.counters()
            assert counts["bad_token"] == 0 and counts["unknown_worker"] == 0, counts
        for sv in servers:      # another server's group answer never reached one (the rig's
            counts = sv.ep.ep.counters()          # ports of hosts in no group drop it)
            assert counts["unknown_worker"] == 0 and counts["bad_token"] == 0, counts
            assert sv.ep.ep.dp.geometry.banks == 2           # by r: an unsharded server's memory
            rec = sv.ep.ep._published                 # what `ltp flows` reads of it (by map ids,
            maps = registry.open_maps(rec)            # the sizes showing no stride) opens
            try:
                assert maps.geometry.stride == S and maps.counters()["data"] > 0
                snap = flows.snapshot(rec, maps)      # `ltp flows`: the op's rounds
                s = servers.index(sv)
                assert (snap["round_now"]["round"], snap["round_now"]["wire_round"]) == \
                    (6, 6 * S + s)
                assert {(f["last_round"], f["last_wire_round"]) for f in snap["flows"]} == \
                    {(6, 6 * S + s)}
                assert snap["label"] == f"rank {s}"   # servers first: server s is rank s
            finally:
                maps.close()
        assert [d.ep._published.label for d in devices] == [f"rank {S + w}" for w in range(2)]
        # an error names the op's round, and the wire's: a round server 1 never
        # opened (its program drops the frames unanswered) fails its push
        from ltpx.errors import TransportError
        with pytest.raises(TransportError, match=r"round 20 \(wire round 41, server 1 of 2\)"):
            links[0][1].ep.push(20, grads[0, 1], links[0][1].ps, reliable=True, timeout_s=0.5)
        plan = links[0][1].ep.prepare_push(22, grads[0, 1], links[0][1].ps, reliable=True,
                                           timeout_s=0.5)     # sent later: an answer stream's
        with pytest.raises(TransportError, match=r"round 22 \(wire round 45, server 1 of 2\)"):
            plan.send()
        before = devices[0].ep
        links[0][1].ensure(4 * n)                                  # a larger op: made anew
        assert devices[0].ep is not before and devices[0].size >= 4 * n
        assert links[0][0].ep.ep is links[0][1].ep.ep is devices[0].ep
    finally:
        for w in range(2):
            for link in links[w]:
                link.close()
            devices[w].close()
        for sv in servers:
            sv.close()
