# SPDX-License-Identifier: Apache-2.0
"""The default sender (control/transport/options.choose_sender): the ACK
clock where `ltp doctor`'s grow check passes, the socket sender where it
does not, said in the push report, the endpoint's record (`ltp flows`) and
one log line; an explicit sender wins and asks no check."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from conftest import requires_bpf


def _verdict(ok: bool, source: str = "checked"):
    from ltpx.dataplane.doctor.growcheck import Verdict
    return Verdict(ok, "native veth: what the check saw", True, source)


@pytest.mark.unit
def test_auto_is_the_clock_where_the_check_passes_and_the_socket_where_it_fails(caplog):
    from ltpx.control.transport.options import AUTO, DEFAULTS, choose_sender
    assert DEFAULTS.sender == AUTO
    with caplog.at_level(logging.WARNING, "ltpx.sender"):
        c = choose_sender(AUTO, lambda: _verdict(True))
        assert (c.sender, c.asked, c.fell_back) == ("xdp", "auto", False)
        assert c.why.startswith("xdp: the default, the grow check passed")
        assert not caplog.records
        c = choose_sender(AUTO, lambda: _verdict(False), where="Endpoint('w0')")
    assert (c.sender, c.fell_back) == ("socket", True)
    assert c.why.startswith("socket: the fallback, the grow check failed (native veth")
    assert c.to_dict() == {"sender": "socket", "asked": "auto", "why": c.why}
    # one line, naming the endpoint and why
    assert [r.getMessage() for r in caplog.records] == [f"Endpoint('w0'): sender {c.why}"]


@pytest.mark.unit
def test_a_fallback_the_process_already_logged_is_not_logged_again(caplog):
    from ltpx.control.transport.options import AUTO, choose_sender
    with caplog.at_level(logging.WARNING, "ltpx.sender"):
        c = choose_sender(AUTO, lambda: _verdict(False, source="process"))
    assert c.sender == "socket" and "this process's grow check failed" in c.why
    assert not caplog.records
    c = choose_sender(AUTO, lambda: _verdict(True, source="cache"))
    assert c.sender == "xdp" and "the cached grow check passed" in c.why


@pytest.mark.unit
def test_an_explicit_sender_wins_and_asks_no_check():
    from ltpx.control.transport.options import choose_sender

    def no_check():
        raise AssertionError("an explicit sender must not run the grow check")
    for asked in ("socket", "xdp"):
        c = choose_sender(asked, no_check)
        assert (c.sender, c.asked, c.why, c.fell_back) == (asked, asked, f"{asked}: asked for",
                                                           False)
    with pytest.raises(ValueError, match="sender must be one of auto, socket, xdp"):
        choose_sender("tc", no_check)


@pytest.mark.unit
def test_the_settings_default_is_auto_and_the_environment_still_wins(monkeypatch):
    from ltpx.control.settings_table import SENDERS, TABLE
    from ltpx.control.torchapi.settings import Settings
    assert TABLE["sender"].default == "auto" and SENDERS == ("auto", "socket", "xdp")
    monkeypatch.delenv("LTP_SENDER", raising=False)
    assert Settings.resolve({}).sender == "auto"
    monkeypatch.setenv("LTP_SENDER", "socket")
    assert Settings.resolve({}).sender == "socket"


@pytest.mark.unit
def test_ltp_train_takes_auto_for_every_transport_and_xdp_only_for_ltp():
    from ltpx.control.training.config import TrainConfig
    assert TrainConfig().sender == "auto"
    TrainConfig(transport="tcp", sender="auto").validate()
    TrainConfig(transport="tcp", sender="socket").validate()
    with pytest.raises(ValueError, match="sender"):
        TrainConfig(transport="tcp", sender="xdp").validate()


# ------------------------------------------------------------------ real endpoints

@pytest.fixture
def pair():
    from ltpx.dataplane.rig.pair import VethPair
    with VethPair("ltp-t-snd") as p:
        yield p


def _endpoints(pair, **worker_kw):
    """A PS on b and worker 1 on a, native mode (both ends carry ltp_xdp)."""
    from ltpx.control.transport.endpoint import Endpoint
    from ltpx.control.trust.tokens import new_secret
    secret = new_secret()
    ps = Endpoint(pair.b.dev, pair.b.ip, {1: 0}, 4096, ns=pair.b.ns, sender="socket",
                  secret=secret)
    try:
        wk = Endpoint(pair.a.dev, pair.a.ip, {1: 0}, 4096, ns=pair.a.ns, self_id=1,
                      secret=secret, **worker_kw)
    except BaseException:
        ps.close()
        raise
    return ps, wk


def _push(ps, wk, round_: int):
    from ltpx.control.transport.results import Peer
    ps.open_round(round_, 4096)
    rep = wk.push(round_, np.arange(4096, dtype=np.float32), Peer(1, ps.ip))
    res = ps.wait_round(round_)
    assert res.masks.all()
    return rep


@pytest.mark.rig
@requires_bpf
def test_an_endpoint_by_default_sends_with_what_the_grow_check_says(pair):
    from ltpx.dataplane.doctor.growcheck import grow_verdict
    from ltpx.dataplane.xdp import registry
    want = "xdp" if grow_verdict("native").ok else "socket"
    ps, wk = _endpoints(pair)
    try:
        assert wk.sender_choice.sender == want and wk.sender_choice.asked == "auto"
        rep = _push(ps, wk, 1)
        assert rep.sender == want and rep.sender_why == wk.sender_choice.why
        if want == "xdp":
            assert rep.clock_tx > 0
        rec = registry.read_record(pair.a.dev, pair.a.ns)
        assert (rec.sender, rec.sender_why) == (want, wk.sender_choice.why)
        assert rec.to_dict()["sender"] == want
        # a push naming its own sender says so
        from ltpx.control.transport.options import PushOptions
        from ltpx.control.transport.results import Peer
        ps.open_round(2, 4096)
        rep = wk.push(2, np.ones(4096, np.float32), Peer(1, ps.ip),
                      options=PushOptions(sender="socket"))
        ps.wait_round(2)
        assert rep.sender == "socket"
        assert rep.sender_why == ("socket: asked for by this push" if want == "xdp"
                                  else wk.sender_choice.why)
    finally:
        wk.close()
        ps.close()


@pytest.mark.root
@requires_bpf
def test_an_explicit_socket_sender_wins_over_a_passing_check(pair):
    from ltpx.control.transport.options import PushOptions
    ps, wk = _endpoints(pair, push_options=PushOptions(sender="socket", rto_rtts=3))
    try:
        assert wk.sender_choice.to_dict() == {"sender": "socket", "asked": "socket",
                                              "why": "socket: asked for"}
        rep = _push(ps, wk, 1)
        assert (rep.sender, rep.clock_tx, rep.sender_why) == ("socket", 0, "socket: asked for")
    finally:
        wk.close()
        ps.close()


def _own_cache(tmp_path, monkeypatch):
    """A compile-cache folder of the test's own (LTP_CACHE_DIR), holding
    copies of the compiled programs the machine's cache holds (no compile),
    with this process's grow-check answers forgotten."""
    import shutil
    from ltpx.dataplane.doctor import growcheck
    from ltpx.dataplane.xdp import bpfcache
    d = tmp_path / "cache"
    d.mkdir(mode=0o755)
    for p in bpfcache.cache_dir().glob(f"*{bpfcache.SUFFIX}"):
        shutil.copyfile(p, d / p.name)
    monkeypatch.setenv(bpfcache.ENV, str(d))
    growcheck.forget()
    return d


@pytest.fixture
def failed_check_cache(tmp_path, monkeypatch):
    """A compile-cache folder of this test's own (LTP_CACHE_DIR) holding a
    definite failed grow check for native mode, as `ltp doctor` keeps one on
    a kernel where frames do not grow; this process's answers forgotten
    before and after."""
    from ltpx.dataplane.doctor import growcheck
    d = _own_cache(tmp_path, monkeypatch)
    key = "grow-" + growcheck._key("native")[:32]
    (d / f"{key}.json").write_text(
        '{"ok": false, "detail": "native veth: 0 of 7 ACKs grown into DATA, 7 failed grows, '
        '1/8 chunks delivered", "definite": true, "source": "checked"}')
    os.chmod(d / f"{key}.json", 0o644)
    yield d
    growcheck.forget()


@pytest.mark.rig
@requires_bpf
def test_an_endpoint_falls_back_to_the_socket_and_says_so(pair, failed_check_cache, caplog):
    from ltpx.dataplane.xdp import registry
    with caplog.at_level(logging.WARNING, "ltpx.sender"):
        ps, wk = _endpoints(pair)
    try:
        c = wk.sender_choice
        assert (c.sender, c.asked, c.fell_back) == ("socket", "auto", True)
        assert c.why.startswith("socket: the fallback, the cached grow check failed "
                                "(native veth: 0 of 7 ACKs grown")
        assert [r.getMessage() for r in caplog.records] == [
            f"Endpoint({pair.a.dev!r}): sender {c.why}"]
        rep = _push(ps, wk, 1)
        assert (rep.sender, rep.clock_tx, rep.sender_why) == ("socket", 0, c.why)
        assert registry.read_record(pair.a.dev, pair.a.ns).sender_why == c.why
    finally:
        wk.close()
        ps.close()


@pytest.mark.rig
@requires_bpf
def test_the_grow_check_runs_once_and_is_kept_per_kernel(tmp_path, monkeypatch):
    """The first asker checks and keeps a definite answer in the cache
    folder; a new process (forget) reads it; later asks are the process's."""
    from ltpx.dataplane.doctor import growcheck
    d = _own_cache(tmp_path, monkeypatch)
    try:
        first = growcheck.grow_verdict("native")
        assert first.source == "checked" and "ACKs grown into DATA" in first.detail
        kept = list(d.glob("grow-*.json"))
        assert len(kept) == (1 if first.definite else 0)
        if not first.definite:
            pytest.skip(f"the check was not definite here: {first.detail}")
        assert os.stat(kept[0]).st_mode & 0o777 == 0o644
        assert growcheck.grow_verdict("native").source == "process"
        growcheck.forget()
        again = growcheck.grow_verdict("native")
        assert (again.ok, again.detail, again.source) == (first.ok, first.detail, "cache")
        fresh = growcheck.grow_verdict("native", fresh=True)   # `ltp doctor`
        assert fresh.source == "checked"
    finally:
        growcheck.forget()


@pytest.mark.unit
def test_a_check_that_cannot_run_is_a_fail_for_this_process_only(tmp_path, monkeypatch):
    from ltpx.dataplane.doctor import growcheck
    d = tmp_path / "cache"
    d.mkdir(mode=0o755)
    monkeypatch.setenv("LTP_CACHE_DIR", str(d))
    growcheck.forget()
    try:
        v = growcheck.grow_verdict("bogus")
        assert (v.ok, v.definite) == (False, False) and "could not run" in v.detail
        assert not list(d.glob("grow-*.json"))
    finally:
        growcheck.forget()


@pytest.mark.unit
def test_a_paths_loss_is_judged_from_enough_packets_with_a_gap_between_its_two_lines():
    """Sender.learned: sent - acked per push, decayed; a target is heavy
    above HEAVY_LOSS and light again only below LIGHT_LOSS; a multi-target
    push's loss is shared alike; a group push is not counted."""
    from types import SimpleNamespace
    from ltpx.control.transport.sender import HEAVY_LOSS, LIGHT_LOSS, PATH_MIN, Sender
    from ltpx.control.transport.results import Peer, PushReport
    s = Sender(None, None, {1: 0, 2: 1}, job=0, chunk_bytes=1424, max_elems=1 << 16,
               initial_rate_bps=1e9)
    one, two = Peer(1, "198.18.0.2"), Peer(2, "198.18.0.3")

    def learn(targets, sent, acked, group=False):
        rep = PushReport(round=1, chunks=acked, sent=sent, resent=0, acked=acked,
                         closed_by_receiver=True, duration_s=0.1, passes=1)
        assert s.learned(SimpleNamespace(targets=targets, group=group), rep) is rep

    learn([one], PATH_MIN - 1, 0)                  # too few packets to judge
    assert s.path_loss(one) is None and not s.heavy
    s.path.clear()
    learn([one], 200, 180)                         # 10 % lost
    assert s.path_loss(one) == pytest.approx(0.1) and s.heavy == {(1, one.ip)}
    learn([one], 200, 200)                         # none lost: 4.1 %, between the lines
    assert LIGHT_LOSS < s.path_loss(one) < HEAVY_LOSS and s.heavy == {(1, one.ip)}
    while s.path_loss(one) >= LIGHT_LOSS:
        learn([one], 200, 200)
    assert not s.heavy
    learn([one, two], 400, 300, group=True)        # a group push: not counted
    assert s.path_loss(two) is None and not s.heavy
    learn([one, two], 400, 300)                    # 25 % of both targets' packets
    assert s.path_loss(two) == pytest.approx(0.25) and s.heavy == {(1, one.ip), (2, two.ip)}
    assert s.heavy_why(two).startswith("socket: auto, 25% of the packets toward 198.18.0.3 "
                                       "(worker 2's flow) lost")
    for _ in range(20):                            # small pushes decay it past judging
        learn([two], 1, 1)
    assert s.path_loss(two) is None and (2, two.ip) in s.heavy
    assert "more than 6% of the packets (when last judged) toward 198.18.0.3" in s.heavy_why(two)


@pytest.fixture(scope="module")
def lossy():
    from conftest import star_rig
    yield from star_rig(clear=True, name="hfauto", workers=1, loss=0.0)


@pytest.mark.rig
@requires_bpf
def test_auto_sends_by_the_socket_while_the_path_loses_much_and_by_the_clock_again(lossy):
    """Under heavy loss the clock is slower than the paced socket
    (docs/benchmarks.md), so auto sends to a target whose packets are lost
    more than HEAVY_LOSS of the time by the socket, says why, and goes back
    to the clock once they are lost less than LIGHT_LOSS."""
    from ltpx.control.transport.endpoint import Endpoint
    from ltpx.control.transport.sender import HEAVY_LOSS
    from ltpx.control.transport.results import Peer
    from ltpx.control.trust.tokens import new_secret
    from ltpx.dataplane.doctor.growcheck import grow_verdict
    if not grow_verdict("native").ok:
        pytest.skip("the grow check fails on this kernel: auto is the socket sender throughout")
    nel, h = 64 * 1024, lossy.workers[0]
    secret = new_secret()
    ps = Endpoint(lossy.ps.ifname, lossy.ps.ip, {h.index: 0}, nel, ns=lossy.ps.netns,
                  sender="socket", secret=secret)
    wk = None
    try:
        wk = Endpoint(h.ifname, h.ip, {h.index: 0}, nel, ns=h.netns, self_id=h.index,
                      secret=secret)
        assert wk.sender_choice.sender == "xdp"

        def push(r: int):
            ps.open_round(r, nel)
            rep = wk.push(r, np.full(nel, r, np.float32), Peer(h.index, lossy.ps.ip),
                          timeout_s=20.0)
            ps.wait_round(r)
            return rep

        lossy.set_loss(0.15)
        reps = [push(r) for r in range(1, 4)]
        assert reps[0].sender == "xdp" and reps[0].clock_tx > 0
        assert wk.sender.path_loss(Peer(h.index, lossy.ps.ip)) > HEAVY_LOSS
        assert [r.sender for r in reps[1:]] == ["socket", "socket"]
        assert reps[1].clock_tx == 0
        assert reps[1].sender_why.startswith("socket: auto, ")
        assert f"toward {lossy.ps.ip} (worker {h.index}'s flow) lost" in reps[1].sender_why
        # an explicit sender is taken as asked, whatever the loss
        from ltpx.control.transport.options import PushOptions
        ps.open_round(4, nel)
        rep = wk.push(4, np.ones(nel, np.float32), Peer(h.index, lossy.ps.ip), timeout_s=20.0,
                      options=PushOptions(sender="xdp"))
        ps.wait_round(4)
        assert rep.sender == "xdp" and rep.clock_tx > 0

        lossy.set_loss(0.0)
        back = [push(r) for r in range(5, 17)]
        senders = [r.sender for r in back]
        assert "xdp" in senders, (senders, wk.sender.path_loss(Peer(h.index, lossy.ps.ip)))
        i = senders.index("xdp")
        assert set(senders[:i]) == {"socket"} and senders[-1] == "xdp"
        assert back[i].sender_why == wk.sender_choice.why
        assert wk.sender.path_loss(Peer(h.index, lossy.ps.ip)) < HEAVY_LOSS
    finally:
        lossy.set_loss(0.0)
        if wk is not None:
            wk.close()
        ps.close()
