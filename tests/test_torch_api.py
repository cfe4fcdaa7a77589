# SPDX-License-Identifier: Apache-2.0
"""ltpx.torch without privileges: its name, its pieces, and whole jobs over TCP on loopback.

The jobs run tests/torch_api_job.py as three real processes (a server and two
workers meeting through env:// with rank 0 hosting the store) over the TCP
transport, so the API's protocol (ops, barriers, buckets, the server's sums,
the answer with its report) runs end to end with real torch and real
sockets. The same script runs over LTP on a rig in test_launch.py.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import finish_all

ROOT = Path(__file__).resolve().parent.parent
JOB = Path(__file__).resolve().parent / "torch_api_job.py"


# --------------------------------------------------------------------------- the name

def _py(code: str, cwd, extra_path: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if extra_path:
        env["PYTHONPATH"] = extra_path
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


PROBE = ("import json, torch, ltpx, ltpx.torch as lt; "
         "print(json.dumps({'torch': torch.__file__, 'lt': lt.__file__, "
         "'api': lt.DistributedOptimizer.__module__, 'ltpx': ltpx.__file__}))")


@pytest.mark.unit
@pytest.mark.parametrize("where", ["elsewhere", "root-on-path"])
def test_ltpx_torch_imports_and_never_shadows_pytorch(where, tmp_path):
    # the editable install from another folder; and from the repository root
    # with the root on sys.path (as `python -m pytest` has it): PyTorch stays PyTorch
    got = _py(PROBE, tmp_path) if where == "elsewhere" else _py(
        "import sys; sys.path.insert(0, '.'); " + PROBE, ROOT, str(ROOT))
    assert got["torch"].endswith("site-packages/torch/__init__.py"), got["torch"]
    assert got["api"] == "ltpx.control.torchapi.optimizer"
    assert got["lt"].endswith("control/torchapi/alias/torch/__init__.py")
    assert not (ROOT / "torch").exists() and not (ROOT / "torch.py").exists()


@pytest.mark.unit
def test_public_names():
    import ltpx.torch as lt
    for name in ("init", "shutdown", "rank", "size", "local_rank", "is_server",
                 "broadcast_parameters", "allreduce", "DistributedOptimizer", "StepReport",
                 "FilledWarning", "report_progress", "digest"):
        assert hasattr(lt, name), name


@pytest.mark.unit
def test_optimizers_it_cannot_make_distributed_are_refused_by_name():
    import ltpx.torch as lt
    from ltpx.errors import UsageError
    p = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(UsageError, match="closure"):      # LBFGS would compute it again, alone
        lt.DistributedOptimizer(torch.optim.LBFGS([p]))
    opt = torch.optim.SGD([p], lr=0.1)
    torch.optim.lr_scheduler.StepLR(opt, 1)              # patches opt.step on the object
    with pytest.raises(UsageError, match="scheduler"):
        lt.DistributedOptimizer(opt)
    with pytest.raises(UsageError, match="torch.optim.Optimizer"):
        lt.DistributedOptimizer(object())


@pytest.mark.unit
def test_init_without_a_launcher_says_how():
    out = subprocess.run([sys.executable, "-c", "import ltpx.torch as lt; lt.init(transport='tcp')"],
                         capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items()
                              if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")})
    assert out.returncode != 0 and "ltp launch" in out.stderr and "torchrun" in out.stderr


# --------------------------------------------------------------------------- pieces

@pytest.mark.unit
def test_settings_keyword_over_environment_over_default(monkeypatch):
    from ltpx.control.torchapi.settings import Settings
    from ltpx.errors import UsageError
    monkeypatch.setenv("LTP_CAPACITY", "25e9")
    monkeypatch.setenv("LTP_MTU", "3000")
    monkeypatch.setenv("LTP_SENDER", "xdp")
    s = Settings.resolve({"mtu": 1400})
    assert (s.capacity, s.mtu, s.transport, s.downlink) == (25e9, 1400, "ltp", "group")
    assert s.sender == "xdp" and Settings.resolve({"sender": "socket"}).sender == "socket"
    monkeypatch.setenv("LTP_BUFFER", "30000")
    from ltpx.control.torchapi.link_ltp import chunk_bytes_for, credit_bytes
    from ltpx.control.transport.rate import credit_window
    s = Settings.resolve({"capacity": 1e9, "mtu": 1500})
    # the credit follows the bottleneck's buffer: 30 kB + 25 kB at 1 Gbit/s, 36 frames of 1500
    assert s.buffer == 30000 and credit_bytes(s) == 55_000
    assert credit_window(1e9, chunk_bytes_for(1500), credit_bytes(s)) == 36
    assert credit_bytes(Settings.resolve({"buffer": 0})) is None  # the transport's default
    for bad, word in (({"mtu": 100}, "mtu"), ({"transport": "udp"}, "transport"),
                      ({"sender": "tc"}, "sender"), ({"buffer": -1}, "buffer"),
                      ({"servers": 0}, "servers"), ({"servers": 9}, "servers"),
                      ({"nope": 1}, "nope")):
        with pytest.raises(UsageError, match=word):
            Settings.resolve(bad)
    monkeypatch.setenv("LTP_TIMEOUT", "soon")
    with pytest.raises(UsageError, match="LTP_TIMEOUT"):
        Settings.resolve({})


def _named(*sizes):
    return [(f"p{i}", torch.nn.Parameter(torch.zeros(n))) for i, n in enumerate(sizes)]


@pytest.mark.unit
def test_call_thread_runs_in_order_reraises_and_is_gone_after_close():
    """A communication thread still alive at interpreter exit aborted the
    process (freeing a tensor as the interpreter ended it): close() joins."""
    import threading
    from ltpx.control.torchapi.threads import CallThread
    t, seen = CallThread("ltpx-test"), []
    release = threading.Event()
    t.submit(release.wait)
    for i in range(5):
        t.submit(seen.append, i)
    t.submit(lambda: 1 / 0)
    t.submit(seen.append, "skipped after the error")
    release.set()
    with pytest.raises(ZeroDivisionError):
        t.drain()
    assert seen == [0, 1, 2, 3, 4]
    t.submit(seen.append, 5)
    t.close()
    assert not t.thread.is_alive() and seen[-1] == 5


@pytest.mark.unit
def test_buckets_reverse_order_closed_at_the_cap():
    from ltpx.control.torchapi.buckets import BucketPlan
    named = _named(100, 10, 300, 5, 50)
    plan = BucketPlan(named, cap=60)
    # reverse registration order; a bucket closes once it holds >= 60
    assert [b.names for b in plan.buckets] == [["p4", "p3", "p2"], ["p1", "p0"]]
    assert plan.sizes == (355, 110) and plan.numel == 465
    assert plan.buckets[1].lo == 355 and plan.buckets[1].spans[0] == (355, 365)
    assert len(BucketPlan(named, cap=10**9)) == 1


@pytest.mark.unit
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_pack_and_apply_keep_dtype_and_values(dtype):
    from ltpx.control.torchapi.buckets import BucketPlan
    g = torch.Generator().manual_seed(0)
    a, b = torch.nn.Parameter(torch.zeros(3, 4, dtype=dtype)), torch.nn.Parameter(torch.zeros(5, dtype=dtype))
    plan = BucketPlan([("a", a), ("b", b)], cap=1000)
    a.grad = torch.randn(3, 4, generator=g).to(dtype)
    b.grad = None                                    # no gradient this step: zeros
    flat = torch.full((plan.numel,), 7.0)
    plan.buckets[0].pack(flat)
    assert torch.equal(flat[5:], a.grad.float().reshape(-1)) and not flat[:5].any()
    agg = torch.randn(plan.numel, generator=g)
    plan.buckets[0].apply(agg)
    assert a.grad.dtype == dtype and b.grad.dtype == dtype
    assert torch.equal(a.grad, agg[5:].view(3, 4).to(dtype))
    assert torch.equal(b.grad, agg[:5].to(dtype))
    if dtype == torch.float32:   # the aggregate itself, no copy
        assert a.grad.data_ptr() == agg[5:].data_ptr()


@pytest.mark.unit
def test_step_report_round_trips_through_float32():
    from ltpx.control.torchapi.ops import StepReport, report_words
    rep = StepReport(step=12, reasons=["complete", "deadline", "early"],
                     delivered={0: 1.0, 1: 0.5, 2: 0.9990234375},
                     filled_chunks={0: 0, 1: 700, 2: 3}, wholly_filled={0: 0, 1: 1, 2: 0},
                     ks=[1, 3, 2], gather_s=0.25, filled_error=0.3125,
                     straggler=2, lateness={0: -0.000244140625, 2: 0.03125})
    words = np.zeros(report_words(3, 3), dtype=np.float32)
    rep.encode(words)
    back = StepReport.decode(words)
    assert back.to_dict() == rep.to_dict()
    assert back.reason == "deadline" and back.early_closed and back.missing_workers == [1]
    assert back.filled_error == 0.3125
    # the straggler: a worker id, or none named; lateness only where timed (1: none)
    assert back.straggler == 2 and back.lateness == {0: -0.000244140625, 2: 0.03125}
    rep.straggler = None
    rep.encode(words)
    assert StepReport.decode(words).straggler is None
    with pytest.raises(ValueError, match="report"):
        StepReport.decode(np.zeros_like(words))


@pytest.mark.unit
def test_ops_number_rounds_alike_and_open_ahead_only_a_repeated_op():
    from ltpx.control.torchapi.ops import (ALLGATHER, BROADCAST, SHUTDOWN, STEP, Op, RoundClock,
                                           preopened)
    step = Op(STEP, sizes=(10, 20, 30))
    assert Op.from_json(step.to_json()) == step
    # the answer: 60 values, then the report (4 words, a reason per bucket, 7 per
    # worker, gather_s, filled_error and the straggler, the loss policy's cap,
    # budget, why and wire)
    assert step.down_elems(4) == 60 + 4 + 3 + 28 + 7 and step.max_elems(4) == 102
    assert step.offsets() == [0, 10, 30]
    c = RoundClock()
    assert c.rounds(step) == [1, 2, 3]
    c.advance(step)
    assert (c.seq, c.rounds(step)) == (1, [4, 5, 6])
    assert preopened(None, step) == 0 and preopened(step, step) == 2
    assert preopened(step, Op(STEP, sizes=(10, 20, 31))) == 0
    assert preopened(step, Op(BROADCAST, sizes=(5,), root=0)) == 0
    # any op but the last is opened ahead when it repeats (FSDP's equal gathers)
    gather, bcast = Op(ALLGATHER, sizes=(64,)), Op(BROADCAST, sizes=(5,), root=0)
    assert preopened(gather, gather) == 1 and preopened(bcast, bcast) == 1
    assert preopened(bcast, Op(BROADCAST, sizes=(5,), root=1)) == 0      # another root
    assert preopened(gather, Op(ALLGATHER, sizes=(65,))) == 0
    assert preopened(Op(SHUTDOWN), Op(SHUTDOWN)) == 0
    # a gather opened ahead for 0, 1, 2 no longer holds its rows once the
    # barrier goes on without worker 2 (every rank asks the same view); a
    # step's rounds take the absent too
    from ltpx.control.torchapi.ops import Go, Members
    view = Members(3)
    opened = view.opened_for(gather)
    assert view.still_ahead(gather, opened)
    view.after_go(Go(gather, absent=(2,)))
    assert not view.still_ahead(gather, opened) and view.still_ahead(step, view.opened_for(step))
    assert view.still_ahead(bcast, view.opened_for(bcast))   # the root is there
    assert Op(BROADCAST, sizes=(5,), root=1).participants(3) == [1]


@pytest.mark.unit
def test_the_op_opened_ahead_is_the_one_that_followed_last_time_alike_on_every_rank():
    """DDP with a BatchNorm broadcasts two buffers before each step: once seen,
    each op of the cycle is opened ahead (the step too, after the second
    broadcast); an op the guess missed is not; a joiner's restored table
    guesses as the members' does; the table keeps KEEP ops."""
    from ltpx.control.torchapi.ops import BROADCAST, STEP, Ahead, Op
    floats, counter = Op(BROADCAST, sizes=(64,), root=0), Op(BROADCAST, sizes=(2,), root=0)
    step = Op(STEP, sizes=(1000, 500))
    server, worker = Ahead(), Ahead()
    cycle = [floats, counter, step] * 4
    got = [(server.take(op), worker.take(op)) for op in cycle]
    assert [s for s, _ in got] == [w for _, w in got]           # every rank alike
    # learnt as it goes: the step's successor once a second cycle began
    assert [s for s, _ in got] == [0, 0, 0] + [0, 1, 2] + [1, 1, 2] * 2
    assert server.guess() == floats                            # what follows a step
    # a step that comes after a step once (an evaluation skipped the forward):
    # not opened for it; the next guess after a step is then a step
    assert server.take(step) == 0 and server.guess() == step and server.take(step) == 2
    joiner = Ahead()
    joiner.restore(worker.snapshot())
    assert [joiner.take(op) for op in cycle[:3]] == [worker.take(op) for op in cycle[:3]]
    # two steps of different wires, a broadcast between: the broadcasts are
    # guessed, the steps never, since neither is the latest step when it
    # comes (the server's link holds that one's settings, which a round
    # opened ahead takes)
    s1, s2 = Op(STEP, sizes=(8,)), Op(STEP, sizes=(8,), wire="bf16")
    b1, b2 = Op(BROADCAST, sizes=(1,), root=0), Op(BROADCAST, sizes=(2,), root=0)
    two = Ahead()
    got = [two.take(op) for op in [s1, b1, s2, b2] * 3]
    assert got[4:] == [0, 1, 0, 1] * 2 and two.after[b1] == s2 and two.guess() != s1
    many = Ahead()
    for k in range(Ahead.KEEP + 10):
        many.take(Op(BROADCAST, sizes=(k + 1,), root=0))
    assert len(many.after) == Ahead.KEEP


# --------------------------------------------------------------------------- whole jobs over TCP

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_local_job(cases: str, workers: int = 2, timeout: float = 240,
                    **env_extra: str) -> list[tuple[str, str]]:
    """Run the server and the workers of a TCP job on loopback; (stdout, stderr)
    of each rank, the server's first."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               WORLD_SIZE=str(workers + 1), LTP_TRANSPORT="tcp", LTP_IP="127.0.0.1",
               OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR",
               **{"LTP_SERVERS": "1", **env_extra})   # rank 0 a server rank (not co-located)
    procs = [subprocess.Popen([sys.executable, str(JOB), cases], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(workers + 1)]
    return finish_all(procs, timeout=timeout)


def run_local_job(cases: str, workers: int = 2, timeout: float = 240) -> list[dict]:
    """Each worker's last JSON line of a TCP job on loopback."""
    outs = start_local_job(cases, workers, timeout)
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs[1:]]


@pytest.mark.root
@pytest.mark.slow
def test_ltpx_torch_logs_through_logging():
    """A script that configures logging gets ltpx.torch's lines in its format."""
    outs = start_local_job("set_to_none", workers=1, JOB_LOG="1")
    assert "INFO ltpx.torch: rank 0 of 2: server over tcp (127.0.0.1)" in outs[0][1]
    assert "INFO ltpx.torch: rank 1 of 2: worker 0 over tcp (127.0.0.1)" in outs[1][1]


@pytest.fixture(scope="module")
def tcp_job():
    return run_local_job("set_to_none,keep_grads,fp16,bf16,unused,nonfinite,modes,contract")


def check_cases(results: list[dict], exact_atol: float = 1e-5) -> None:
    """What every run of torch_api_job.py must show (test_launch.py uses it too)."""
    cases = [r["cases"] for r in results]
    for name in cases[0]:
        assert len({c[name]["digest"] for c in cases}) == 1, f"{name}: replicas differ"
    for name in ("set_to_none", "keep_grads"):
        if name in cases[0]:
            c = cases[0][name]
            assert c["buckets"] >= 2 and c["max_diff_to_single"] < exact_atol, (name, c)
            assert c["last_loss"] < 0.7 * c["first_loss"]
    for name, dtype in (("fp16", "torch.float16"), ("bf16", "torch.bfloat16")):
        if name in cases[0]:
            assert cases[0][name]["dtypes"] == [dtype]
            assert cases[0][name]["wire"] == name     # compress auto: as 2-byte floats
            for c in cases:
                assert c[name]["last_loss"] < c[name]["first_loss"], (name, c[name])
    if "unused" in cases[0]:
        assert all(c["unused"]["never_unchanged"] and c["unused"]["never_grad_zero"]
                   and c["unused"]["only_w0_moved_everywhere"] for c in cases)
    if "modes" in cases[0]:
        n = len(cases)
        for c in cases:
            m = c["modes"]
            assert m["allreduce"]["values"] == [(n + 1) / 2], m   # mean of ranks + 1
            for name in ("no_overlap", "wbsp"):
                assert m[name]["steps"] == 20 and m[name]["last_loss"] < m[name]["first_loss"], m


@pytest.mark.root
@pytest.mark.slow
def test_zero_grad_set_to_none_trains_like_one_process(tcp_job):
    # the workers' mean gradient of each global batch is the single-process
    # gradient: after 30 SGD steps both models agree to float rounding
    check_cases(tcp_job)
    assert tcp_job[0]["cases"]["set_to_none"]["digest"] == \
        tcp_job[0]["cases"]["keep_grads"]["digest"]


@pytest.mark.root
@pytest.mark.slow
def test_optimizer_is_the_users_optimizer_with_torchs_contract(tcp_job):
    """Horovod's way: the DistributedOptimizer is a subclass of the user's
    optimizer's class made at run time (its attributes and step kept), so
    torch's step hooks, LR schedulers and state_dict are torch's own."""
    cases = [r["cases"]["contract"] for r in tcp_job]
    for c in cases:
        assert c["class"] == "Counted" and c["is_sgd"], c
        # the class's own step ran once a step, its hooks as often as torch runs
        # them for that class alone (twice: Counted's step calls SGD's)
        assert c["own_steps"] == c["steps"] == 6, c
        assert c["pre"] == c["post"] == 6 * c["plain_hooks_per_step"], c
        assert abs(c["lr"] - 0.1 * 0.5 ** 3) < 1e-12, c     # StepLR(2, 0.5) after 6 steps
        assert not [w for w in c["warnings"] if "lr_scheduler" in w], c["warnings"]
        assert c["loaded_momenta"] == c["params"], c         # a plain SGD takes its state
        assert c["refused"] == ["UsageError"] * 3, c         # more groups, twice, a copy
    # a pre-hook saw the aggregate: each step's gradients alike on every worker
    # (their own differ: each computes on its half of the batch)
    assert all(g == cases[0]["grads"] for g in (c["grads"] for c in cases)), cases
    assert len(set(cases[0]["grads"])) == 6


@pytest.mark.root
@pytest.mark.slow
def test_rank_and_size_answer_after_shutdown(tcp_job):
    # torch_api_job.py prints its result after lt.shutdown()
    assert [(r["rank"], r["size"]) for r in tcp_job] == [(0, 2), (1, 2)]


@pytest.mark.root
@pytest.mark.slow
def test_half_precision_and_unused_parameters(tcp_job):
    c = tcp_job[0]["cases"]
    assert c["fp16"]["dtypes"] == ["torch.float16"] and c["bf16"]["dtypes"] == ["torch.bfloat16"]
    assert c["unused"]["never_unchanged"]


# --------------------------------------------------------------------------- ltp launch flags

@pytest.mark.rig
@pytest.mark.parametrize("argv, flag", [
    (["--workers", "0", "--", "python", "x.py"], "--workers"),
    (["--servers", "9", "--", "python", "x.py"], "--servers"),
    (["--loss", "2", "--", "python", "x.py"], "--loss"),
    (["--rate", "fast", "--", "python", "x.py"], "--rate"),
    (["--rig", "Bad-Name", "--", "python", "x.py"], "--rig"),
    (["--mtu", "9000", "--", "python", "x.py"], "--mtu"),
    (["--workers", "2"], "--"),
    # a command no rank could run is a usage error before any rig is built
    (["--", "python", "no_such_script.py"], "no such script: no_such_script.py"),
    (["--", "no_such_script.py"], "no such script"),
    (["--", "no_such_program_xyz"], "'no_such_program_xyz': not found on PATH"),
    (["--", "/no/such/binary"], "no such executable file"),
])
def test_launch_bad_flags_exit_2(argv, flag, capsys):
    from ltpx.tools.cli import main
    assert main(["launch", "-j", *argv]) == 2
    err = json.loads(capsys.readouterr().out)
    assert err["exit_code"] == 2 and flag in err["error"]


FAILING_INIT = """
import json, os, threading
from datetime import timedelta
import torch.distributed as dist
import ltpx.torch as lt
store = dist.TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=30), wait_for_workers=False)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), RANK="1", WORLD_SIZE="2",
                  LTP_SERVERS="1")
try:
    lt.init(transport="tcp", timeout=2)
    err = None
except Exception as e:
    err = type(e).__name__
print(json.dumps({"err": err, "threads": [t.name for t in threading.enumerate()]}))
"""


@pytest.mark.slow          # waits out the coordinator's timeout: ~6 s
def test_a_failed_init_leaves_no_heartbeat_running(tmp_path):
    """A worker whose server never shows up: init() fails after the heartbeat
    started (coord.get_many times out), and takes the heartbeat down with it."""
    got = _py(FAILING_INIT, tmp_path, str(ROOT.parent))
    assert got["err"] is not None
    assert not [t for t in got["threads"] if "heartbeat" in t], got["threads"]


# --------------------------------------------------------------------------- checkpoints

class _Steps:
    def __init__(self, steps: int):
        self.steps = steps


@pytest.mark.unit
def test_checkpoints_of_two_jobs_share_a_folder(tmp_path, monkeypatch):
    """Each job prunes only its own files; latest() picks by name, loading none;
    a temp file of this host is removed only when its writer's pid is gone
    (test_checkpoint.py has the other hosts' and the stale ones)."""
    from ltpx.control.torchapi import checkpoint
    monkeypatch.setattr(checkpoint, "state_blob", lambda opt, extra, joiner: b"state")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        tmp = f"ckpt-{checkpoint.tag_for('b')}-00000020.pt.tmp.{checkpoint.host_name()}"
        writing, torn = tmp_path / f"{tmp}.{live.pid}", tmp_path / f"{tmp}.{dead.pid}"
        writing.write_bytes(b"half")
        torn.write_bytes(b"half")
        for step in (5, 10, 15):
            checkpoint.save(str(tmp_path), _Steps(step), {}, "a")
            checkpoint.save(str(tmp_path), _Steps(step + 1), {}, "b")
        assert writing.exists() and not torn.exists()
    finally:
        live.kill()
        live.wait()
    names = sorted(p.name for p in tmp_path.glob("ckpt-*.pt"))
    ta, tb = checkpoint.tag_for("a"), checkpoint.tag_for("b")
    assert names == sorted([f"ckpt-{ta}-00000010.pt", f"ckpt-{ta}-00000015.pt",
                            f"ckpt-{tb}-00000011.pt", f"ckpt-{tb}-00000016.pt"])
    assert checkpoint.latest(str(tmp_path), "a").endswith(f"ckpt-{ta}-00000015.pt")
    assert checkpoint.latest(str(tmp_path)).endswith(f"ckpt-{tb}-00000016.pt")
    assert checkpoint.latest(str(tmp_path), "c") is None
    (tmp_path / f"ckpt-{ta}-00000099.pt").write_bytes(b"not a checkpoint")   # never loaded
    assert checkpoint.latest(str(tmp_path), "a").endswith("-00000099.pt")


# --------------------------------------------------------------------------- barriers

class _Interleave:
    """A real store whose add of `key` first runs `then` (another worker's whole
    arrival, between this one's bit and its look at the other groups)."""

    def __init__(self, store, key: str, then):
        self.store, self.key, self.then = store, key, then

    def add(self, key: str, n: int) -> int:
        if key == self.key and n:
            v = self.store.add(key, n)
            then, self.then = self.then, None
            if then:
                then()
            return v
        return self.store.add(key, n)

    def __getattr__(self, name):
        return getattr(self.store, name)


@pytest.mark.unit
def test_the_op_is_described_when_first_arrivals_in_two_groups_race():
    """64 workers (two arrival groups): worker 0 sets its bit, worker 62 arrives
    whole before worker 0 reads group 1. Each sees the other; the op's
    description must be there all the same (the server's release_without_dead
    waits for it)."""
    from datetime import timedelta
    import torch.distributed as dist
    from ltpx.control.torchapi.coord import KEY, Coord
    from ltpx.control.torchapi.ops import STEP, Op
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30),
                          wait_for_workers=False)
    op = Op(STEP, sizes=(4,))
    late = Coord(store, 64, 30.0)
    late.me = 62
    first = Coord(_Interleave(store, f"{KEY}ready/0/0", lambda: late.arrive(0, op)), 64, 30.0)
    first.me = 0
    assert first.arrive(0, op) is False
    assert first.arrived(0) == {0, 62}
    assert store.check([f"{KEY}desc/0"]) and Op.from_json(store.get(f"{KEY}desc/0")) == op
    for w in range(1, 64):   # the rest arrive; the last posts go/0
        if w != 62:
            c = Coord(store, 64, 30.0)
            c.me = w
            last = c.arrive(0, op)
    assert last and first.read_go(0).op == op


class _Counting:
    """A real store that counts the calls made through it, by name."""

    def __init__(self, store):
        self.store, self.calls = store, []

    def __getattr__(self, name):
        f = getattr(self.store, name)
        if not callable(f):
            return f

        def call(*a, **k):
            self.calls.append(name)
            return f(*a, **k)
        return call


@pytest.mark.unit
def test_an_arrival_takes_two_store_calls_and_the_poster_reads_nothing_back():
    """An op's barrier costs store round trips on every rank: a worker that is
    not last describes the op and sets its bit (2 calls); the last also takes
    the post and posts the go (4), and its own wait for the go reads nothing
    back: it is the go it posted, the one every other rank reads."""
    from datetime import timedelta
    import torch.distributed as dist
    from ltpx.control.torchapi.coord import Coord
    from ltpx.control.torchapi.ops import STEP, Op
    from ltpx.control.trust import jobkey
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30),
                          wait_for_workers=False)
    key = jobkey.new_key()
    op = Op(STEP, sizes=(4, 8))
    cos = []
    for w in range(3):
        co = Coord(_Counting(store), 3, 30.0, key=jobkey.store_auth(key, w))
        co.me = w
        cos.append(co)
    for co in cos:
        co.store.calls.clear()
    assert [co.arrive(5, op) for co in cos] == [False, False, True]
    assert [co.store.calls for co in cos[:2]] == [["compare_set", "add"]] * 2
    assert cos[2].store.calls == ["compare_set", "add", "add", "set"]
    cos[2].store.calls.clear()
    mine = cos[2].wait_go(5)
    assert cos[2].store.calls == [] and mine.op == op and mine.absent == ()
    assert [co.wait_go(5) for co in cos[:2]] == [mine, mine]   # read from the store
    # the description is the first arrival's, signed by it
    assert cos[0].take_from("desc/5", lambda b: Op.from_json(b)) == (0, op)
    cos[2].store.calls.clear()     # read once: asked again, it comes from the store
    assert cos[2].wait_go(5) == mine and cos[2].store.calls == ["wait", "get"]


STORE_HOST = """
import sys, time
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
print(store.port, flush=True)
time.sleep(120)
"""


@pytest.mark.unit
def test_a_heartbeat_whose_store_is_gone_says_so_once_and_ends(caplog):
    import logging
    from datetime import timedelta
    import torch.distributed as dist
    from ltpx.control.torchapi.liveness import Beat
    host = subprocess.Popen([sys.executable, "-c", STORE_HOST], stdout=subprocess.PIPE, text=True)
    try:
        port = int(host.stdout.readline())
        store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=10))
        with caplog.at_level(logging.INFO, logger="ltpx.torch.liveness"):
            beat = Beat(store, "hb/7")
            host.kill()
            host.wait()
            beat.thread.join(timeout=30)
            assert not beat.thread.is_alive()
        lines = [r for r in caplog.records if r.name == "ltpx.torch.liveness"]
        assert len(lines) == 1 and "hb/7" in lines[0].getMessage()
        beat.stop()
    finally:
        host.kill()
        host.wait()


@pytest.mark.unit
def test_a_wholly_filled_worker_that_left_is_named_as_gone_not_late():
    # issue 25, item 5: a dead worker's filled gradient is not "started late"
    from ltpx.control.torchapi.ops import StepReport
    from ltpx.control.torchapi.gradsync import filled_text
    rep = StepReport(step=7, reasons=["early"], delivered={0: 1.0, 1: 0.0, 2: 0.0},
                     filled_chunks={1: 9, 2: 9}, wholly_filled={1: 1, 2: 1}, ks=[1, 1, 1],
                     gather_s=0.1)
    text = filled_text(rep, 2, 5, gone=[1])
    assert "Worker(s) [1] left the job" in text and "dead or hung" in text
    assert "Worker(s) [2] started pushing long after" in text
    assert "[1] started" not in text
    assert "left the job" not in filled_text(rep, 2, 5, gone=[])


@pytest.mark.root
@pytest.mark.slow
def test_a_worker_sending_nan_leaves_every_replica_finite_and_is_named(tcp_job):
    # issue 26, point 3: worker 1's gradient is NaN at step 3; the server
    # treats it as lost for that step, every replica stays finite and equal
    cases = [r["cases"]["nonfinite"] for r in tcp_job]
    assert all(c["finite"] for c in cases)
    assert len({c["digest"] for c in cases}) == 1
    for c in cases:
        assert c["reports"][2] == [1] and not any(c["reports"][:2] + c["reports"][3:])
    assert cases[0]["warned"] and cases[1]["warned"]          # worker 0 and the one named


@pytest.mark.unit
@pytest.mark.parametrize("strategy", ["mean", "zero", "stale"])
def test_a_non_finite_row_is_filled_from_the_others(strategy):
    from ltpx.control.torchapi.links import Gathered
    from ltpx.control.torchapi.server import contain_nonfinite
    vals = np.arange(3 * 10, dtype=np.float32).reshape(3, 10)
    vals[1, 4] = np.nan
    masks = np.ones((3, 3), dtype=bool)
    masks[2, 2] = False                  # worker 2's last chunk was lost and filled
    vals[2, 8:] = np.nan                 # ... by a mean that took worker 1's NaN in
    g = Gathered(round=1, values=vals, workers=[0, 1, 2], delivered=masks.sum(axis=1),
                 chunks=3, filled=(~masks).sum(axis=1), chunk_elems=4, masks=masks)
    bad = contain_nonfinite(g, strategy)
    assert bad.tolist() == [False, True, False] and np.isfinite(g.values).all()
    assert not g.masks[1].any() and g.masks[0].all()
    if strategy == "mean":   # the mean of the finite workers that delivered each chunk
        assert np.array_equal(g.values[1, :8], (g.values[0, :8] + g.values[2, :8]) / 2)
        assert np.array_equal(g.values[1, 8:], g.values[0, 8:])
        assert np.array_equal(g.values[2, 8:], g.values[0, 8:])
    else:
        assert not g.values[1].any()
    clean = Gathered(round=2, values=np.ones((2, 5), np.float32), workers=[0, 1],
                     delivered=np.ones(2), chunks=1, filled=np.zeros(2))
    assert not contain_nonfinite(clean, "mean").any()       # TCP: no masks, nothing to do
