# SPDX-License-Identifier: Apache-2.0
"""Sharded parameter servers (control/torchapi/shards.py, `ltp rig up/launch/train --servers`).

Units: the slice plan (balanced, contiguous, covering, refusing more servers
than elements), each shard's op, the merged step report, the settings and
flag checks. On a rig (root, bcc): a 2-server rig's up/status/down through
the CLI, and one 2-server, 2-worker native rig that `ltp launch --servers 2`
(the CNN example) and `ltp train --servers 2` (the built-in job, 1 % loss)
both use: replicas identical, accuracy reached. About two minutes on 2 cores.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import requires_bpf
from ltpx.control.torchapi.ops import STEP, Op, StepReport, report_words
from ltpx.control.torchapi.settings import Settings
from ltpx.control.torchapi.shards import merge_reports, plan_slices, split_op
from ltpx.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
LTP = str(Path(sys.executable).with_name("ltp"))
TAG = f"{os.getpid() % 10000}"
RIG = f"hcs{TAG}"


def ltp(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([LTP, *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


# --------------------------------------------------------------------------- units

@pytest.mark.unit
@pytest.mark.parametrize("n,S", [(1, 1), (10, 3), (234_122, 2), (234_122, 4), (7, 7), (1000, 8)])
def test_slices_are_balanced_contiguous_and_cover_everything(n, S):
    sl = plan_slices(n, S)
    assert len(sl) == S and sl[0][0] == 0 and sl[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(sl, sl[1:]))          # contiguous, in order
    sizes = [hi - lo for lo, hi in sl]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1      # balanced by bytes
    assert sorted(sizes, reverse=True) == sizes                    # the larger ones first


@pytest.mark.unit
@pytest.mark.parametrize("n,S", [(1, 2), (3, 4), (0, 1), (5, 0)])
def test_more_servers_than_elements_is_refused(n, S):
    with pytest.raises(UsageError, match="server"):
        plan_slices(n, S)


@pytest.mark.unit
def test_each_shard_gets_a_slice_of_every_piece_and_short_pieces_are_padded():
    op = Op(STEP, sizes=(1001, 3, 50))
    subs, slices = split_op(op, 4)
    assert [s.sizes for s in subs] == [(251, 1, 13), (250, 1, 13), (250, 1, 12), (250, 1, 12)]
    assert all(s.kind == STEP and s.bubble == op.bubble for s in subs)
    assert slices[1][-1][1] == 4                   # 3 elements padded to one per server
    assert sum(s.sizes[0] for s in subs) == 1001


@pytest.mark.unit
def test_merged_report_takes_the_worst_close_and_sums_what_was_filled():
    a = StepReport(step=5, reasons=["complete", "early"], delivered={0: 1.0, 1: 0.5},
                   filled_chunks={0: 0, 1: 4}, wholly_filled={0: 0, 1: 1}, ks=[1, 1],
                   gather_s=0.02, straggler=1, lateness={0: -0.001, 1: 0.004})
    b = StepReport(step=5, reasons=["deadline", "complete"], delivered={0: 1.0, 1: 1.0},
                   filled_chunks={0: 0, 1: 0}, wholly_filled={0: 0, 1: 0}, ks=[1, 1],
                   gather_s=0.03, lateness={0: -0.001, 1: 0.002})
    m = merge_reports([a, b], 2)
    assert m.reasons == ["deadline", "early"] and m.step == 5
    assert m.delivered == {0: 1.0, 1: 0.75} and m.filled_chunks == {0: 0, 1: 4}
    assert m.wholly_filled == {0: 0, 1: 1} and m.gather_s == 0.03
    # one server named worker 1, the other none: worker 1; lateness averaged
    assert m.straggler == 1 and m.lateness == pytest.approx({0: -0.001, 1: 0.003})
    words = np.zeros(report_words(2, 2), dtype=np.float32)   # it travels as the answer's tail
    m.encode(words)
    back = StepReport.decode(words)
    assert back.reasons == m.reasons and back.filled_chunks == m.filled_chunks


@pytest.mark.rig
def test_servers_setting_and_flags_are_checked():
    assert Settings.resolve({"servers": 4}).servers == 4
    with pytest.raises(UsageError, match="servers"):
        Settings.resolve({"servers": 9})
    for argv in (["train", "--compare", "ltp:servers=9"], ["train", "--compare", "ltp:x=1"],
                 ["train", "--servers", "2", "--transport", "gloo"],
                 ["launch", "--servers", "9", "--", "true"],
                 ["rig", "up", "--topology", "leaf-spine", "--servers", "2"],
                 ["rig", "up", "--servers", "9"]):
        r = ltp(*argv)
        assert r.returncode == 2 and "servers" in r.stderr, (argv, r.stderr)


# --------------------------------------------------------------------------- on a rig

@requires_bpf
@pytest.mark.rig
def test_rig_with_two_servers_up_status_down():
    name = f"hcu{TAG}"
    try:
        r = ltp("rig", "up", "--name", name, "--workers", "2", "--servers", "2", "--mode", "skb",
                "-j")
        assert r.returncode == 0, r.stderr
        st = json.loads(ltp("rig", "status", "--name", name, "-j").stdout)
        assert [h["name"] for h in st["hosts"]] == ["ps", "ps1", "w0", "w1"]
        assert [(h["name"], h["ip"]) for h in st["hosts"]][:2] == [("ps", "198.18.0.1"),
                                                                    ("ps1", "198.18.0.2")]
        assert [q["port"] for q in st["bottleneck"] if q["present"]] == ["sw-ps", "sw-ps1"]
        assert st["bridge"] == "br0" and st["config"]["servers"] == 2
        addrs = ltp("rig", "exec", "--name", name, "w1", "--", "ip", "-br", "addr").stdout
        assert "198.18.0.11/24" in addrs and "198.18.1." not in addrs   # one device a worker
        assert "ps1" in ltp("rig", "status", "--name", name).stdout
    finally:
        r = ltp("rig", "down", "--name", name)
    assert r.returncode == 0, r.stderr
    left = subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout
    assert f"ltp-{name}-" not in left
    assert not os.path.exists(f"/run/ltp/rigs/{name}.json")


@pytest.fixture(scope="module")
def rig():
    from ltpx.control.training.onrig import rig_config
    from ltpx.dataplane.rig.star import Rig
    with Rig(rig_config(RIG, "ltp", workers=2, rate_bps=10**9, buffer_bytes=30_000,
                        loss=0.0, servers=2)) as r:
        yield r


@requires_bpf
@pytest.mark.rig
def test_launch_two_servers_identical_replicas(rig):
    r = ltp("launch", "--rig", RIG, "--workers", "2", "--servers", "2", "-j", "--",
            "python", "docs/examples/digits_cnn.py", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout)
    assert [(x["label"], x["host"]) for x in s["ranks"]] == [("s0", "ps"), ("s1", "ps1"),
                                                            ("w0", "w0"), ("w1", "w1")]
    res = [x["last_json"] for x in s["ranks"] if x["role"] == "worker"]
    assert all(x["accuracy"] >= 0.95 for x in res), [x["accuracy"] for x in res]
    assert len({x["digest"] for x in res}) == 1


@requires_bpf
@pytest.mark.rig
def test_train_two_servers_under_loss_reaches_accuracy(rig):
    rig.set_loss(0.01)
    rig.reset_loss_counters()
    try:
        r = ltp("train", "--name", RIG, "--workers", "2", "--servers", "2", "--epochs", "3",
                "--target-accuracy", "0.9", "-j", timeout=400)
    finally:
        rig.set_loss(0.0)
    dropped = rig.loss_counters()["dropped"]
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["servers"] == 2 and res["rig"]["servers"] == 2
    assert res["replicas_identical"], res["worker_digests"]
    assert res["final_accuracy"] >= 0.9 and res["time_to_target"] is not None
    assert dropped > 0                              # the injector dropped packets on the way


@requires_bpf
@pytest.mark.rig
def test_train_with_a_server_beside_each_worker_under_loss_reaches_accuracy():
    # no server hosts, over LTP: 3 nodes of a worker and a server, each rank
    # on a device of its own, a node's two sharing one lossy link
    r = ltp("train", "--colocate", "--workers", "3", "--epochs", "3", "--loss", "0.01",
            "--target-accuracy", "0.9", "-j", timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["servers"] == 3 and res["rig"]["nodes"] == 3 and res["rig"]["colocated"]
    assert res["replicas_identical"], res["worker_digests"]
    assert res["final_accuracy"] >= 0.9 and res["time_to_target"] is not None


@pytest.mark.unit
@pytest.mark.parametrize("n,S", [(7, 3), (2, 3), (9, 1)])
def test_an_all_gathers_rows_are_joined_from_every_servers_slice(n, S):
    """Server s answers slice s of every worker's row (a row per worker of its
    slice's width, padded slices too); the join puts each back in its row."""
    import torch.distributed as dist

    from ltpx.control.torchapi.coord import Coord
    from ltpx.control.torchapi.exchange import Exchange
    from ltpx.control.torchapi.ops import ALLGATHER, Op
    from ltpx.control.torchapi.shards import ShardedExchange, ShardRun, split_op
    W = 4
    rows = np.arange(W * n, dtype=np.float32).reshape(W, n) + 1
    op = Op(ALLGATHER, sizes=(n,))
    subs, slices = split_op(op, S)
    padded = np.zeros((W, max(n, S)), dtype=np.float32)
    padded[:, :n] = rows
    bufs = [padded[:, lo:hi].reshape(-1).copy() for lo, hi in slices[0]]   # the servers' answers
    assert [len(b) for b in bufs] == [sub.down_elems(W) for sub in subs]
    sh = ShardedExchange([Exchange(None, Coord(dist.HashStore(), W, 5.0), 0, W)
                          for _ in range(S)], 0, W)
    try:
        out = np.full(op.down_elems(W) + 3, -1.0, dtype=np.float32)
        got = sh.join(ShardRun(op, [], slices), bufs, out)
        assert np.array_equal(got.reshape(W, n), rows)
        assert np.all(out[W * n:] == -1.0)          # nothing written past the answer
    finally:
        sh.close()


@pytest.mark.unit
@pytest.mark.parametrize("sizes,S", [((7, 2, 9), 3), ((5, 1), 2), ((6,), 1)])
def test_answers_read_straight_into_their_places_equal_the_join(sizes, S):
    """A link that scatters (TCP's) reads server s's answer into its slices'
    places in the op's answer, padding into scratch: the same as joining the
    S answers, and nothing written past the answer."""
    import types

    import torch.distributed as dist

    from ltpx.control.torchapi.coord import Coord
    from ltpx.control.torchapi.exchange import Exchange
    from ltpx.control.torchapi.ops import ALLREDUCE, Op
    from ltpx.control.torchapi.shards import ShardedExchange, ShardRun, split_op
    W = 2
    op = Op(ALLREDUCE, sizes=sizes)
    subs, slices = split_op(op, S)
    rng = np.random.default_rng(3)
    bufs = [rng.standard_normal(sub.down_elems(W)).astype(np.float32) for sub in subs]
    exs = [Exchange(None, Coord(dist.HashStore(), W, 5.0), 0, W) for _ in range(S)]
    for ex, buf in zip(exs, bufs):
        def finish(r, tail, parts, buf=buf):       # the server's answer, part by part
            at = 0
            for x in parts:
                x[:] = buf[at:at + x.size]
                at += x.size
            assert at == len(buf)
        ex.finish = finish
    sh = ShardedExchange(exs, 0, W)
    try:
        run = ShardRun(op, [types.SimpleNamespace(op=sub) for sub in subs], slices)
        joined = sh.join(run, bufs, np.zeros(op.down_elems(W), dtype=np.float32))
        out = np.full(op.down_elems(W) + 3, -1.0, dtype=np.float32)
        got = sh.scatter(run, out)
        assert np.array_equal(got, joined) and np.all(out[len(joined):] == -1.0)
    finally:
        sh.close()


@pytest.mark.unit
def test_both_exchanges_are_what_the_job_asks_of_one():
    """Exchange and ShardedExchange each have every member of the
    OpExchange protocol; the sharded one answers membership, the timeline
    and an aside from shard 0's Exchange, by its own declared members."""
    import torch.distributed as dist

    from ltpx.control.torchapi.coord import Coord
    from ltpx.control.torchapi.exchange import Exchange, OpExchange
    from ltpx.control.torchapi.shards import ShardedExchange
    exs = [Exchange(None, Coord(dist.HashStore(), 2, 5.0), 0, 2) for _ in range(2)]
    sh = ShardedExchange(exs, 0, 2)
    try:
        assert isinstance(exs[0], OpExchange) and isinstance(sh, OpExchange)
        assert not isinstance(object(), OpExchange)
        exs[0].lost[1] = 7
        assert sh.lost == {1: 7} and sh.timeline is exs[0].timeline
        sh.set_aside("evaluation")
        assert exs[0].aside_why == "evaluation" and exs[1].aside_why == ""
        with pytest.raises(AttributeError):
            sh.snapshot     # noqa: B018 (rejoining is one server's: not forwarded)
    finally:
        sh.close()


@pytest.mark.unit
def test_a_shards_blocking_wait_does_not_hold_up_another_shards_word():
    # a worker's shard threads: shard 0 waits for its server's word while
    # shard 1 must give its own; over one shared client the set would queue
    # behind the wait until it timed out (a deadlock with 3+ servers, seen)
    import threading
    import time
    from datetime import timedelta
    import torch.distributed as dist
    from ltpx.control.torchapi.shards import shard_clients
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", master.port, is_master=False)
    c0, c1 = shard_clients(client, 2)
    waited: list[str] = []
    going = threading.Event()
    t = threading.Thread(target=lambda: (going.set(), c0.wait(["open/1"], timedelta(seconds=30)),
                                         waited.append("open")))
    t.start()
    try:
        assert going.wait(10)
        time.sleep(0.5)                    # shard 0 in its wait (sooner: only a weaker test)
        c1.set("ack/1/0", "1")             # returns while shard 0 still waits ...
        assert t.is_alive() and not waited
        assert master.get("ack/1/0") == b"1"
    finally:
        master.set("open/1", "1")          # ... which the word it waited for ends
        t.join(10)
    assert waited == ["open"]
