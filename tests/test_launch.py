# SPDX-License-Identifier: Apache-2.0
"""ltpx.torch over LTP on a rig: `ltp launch` of the examples and of the API's
cases, a failing rank, and the documented torchrun command run inside rig
namespaces with `ltp rig exec` (which runs it under `ip netns exec`, where
the ranks must mount their own bpffs).

One 3-worker native-mode rig serves every test (`ltp launch --rig` uses an
existing rig and leaves it). Each test starts a server and 2-3 workers
(torch import and a bcc compile each): 25-45 s apiece on 2 cores.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import finish_all, requires_bpf, sigint_default
from test_torch_api import check_cases

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
RIG = "i14launch"

pytestmark = [requires_bpf, pytest.mark.rig]


@pytest.fixture(scope="module")
def rig():
    from ltpx.control.training.onrig import rig_config
    from ltpx.dataplane.rig.star import Rig
    with Rig(rig_config(RIG, "ltp", workers=3, rate_bps=10**9, buffer_bytes=30_000,
                        loss=0.0)) as r:
        yield r


def launch(workers: int, *cmd: str, flags: tuple = (), timeout: float = 240) -> tuple[int, dict, str]:
    """`ltp launch -j` on the test rig: (exit code, JSON summary, stderr)."""
    out = subprocess.run([str(BIN / "ltp"), "launch", "--rig", RIG, "--workers", str(workers),
                          *flags, "-j", "--", *cmd], capture_output=True, text=True,
                         timeout=timeout, cwd=ROOT)
    assert out.stdout.strip(), out.stderr[-3000:]
    return out.returncode, json.loads(out.stdout), out.stderr


def worker_results(summary: dict) -> list[dict]:
    return [r["last_json"] for r in summary["ranks"] if r["role"] == "worker"]


@pytest.mark.rig
def test_digits_cnn_example_learns_with_identical_replicas(rig):
    rc, s, err = launch(3, "python", "docs/examples/digits_cnn.py")
    assert rc == 0 and s["exit_code"] == 0 and s["exit_from"] == [], err[-3000:]
    assert [r["label"] for r in s["ranks"]] == ["s0", "w0", "w1", "w2"]
    assert s["rig"]["name"] == RIG and s["rig"]["kept"]          # it was there before
    res = worker_results(s)
    assert all(r["accuracy"] >= 0.95 for r in res), [r["accuracy"] for r in res]
    assert len({r["digest"] for r in res}) == 1
    assert all(r["wall_s"] > 0 and r["exit_code"] == 0 for r in s["ranks"])
    assert "[w0] " in err                                          # rank-prefixed output


@pytest.mark.rig
def test_big_model_example_in_several_buckets(rig):
    rc, s, err = launch(2, "python", "docs/examples/big_model.py")
    assert rc == 0, err[-3000:]
    res = worker_results(s)
    assert res[0]["params"] >= 4_000_000 and len(res[0]["buckets"]) >= 3
    assert all(r["accuracy"] >= 0.95 for r in res), [r["accuracy"] for r in res]
    assert len({r["digest"] for r in res}) == 1


@pytest.mark.rig
def test_api_cases_over_ltp_and_a_wholly_filled_round_warns(rig):
    rc, s, err = launch(3, "python", "tests/torch_api_job.py",
                        "set_to_none,fp16,bf16,unused,filled")
    assert rc == 0, err[-3000:]
    res = worker_results(s)
    check_cases(res)
    f = [r["cases"]["filled"] for r in res]
    # worker 1 slept 2 s inside backward at step 3, between its two buckets
    assert f[0]["buckets"] == 2
    assert f[0]["step3"]["wholly_filled"]["1"] == 1 and 1 in f[0]["step3"]["missing_workers"]
    assert f[0]["step3"]["early_closed"] and f[0]["total"] >= 1
    assert f[0]["warnings"] >= 1 and f[1]["warnings"] >= 1      # worker 0 and the one filled
    assert "FilledWarning" in err and "worker(s) [1]" in err
    # worker 1 was slow, not gone: the warning says so, and names nobody as dead
    assert "Worker(s) [1] started pushing long after the others" in err
    assert "left the job" not in err


@pytest.mark.rig
def test_a_failing_rank_fails_the_launch_and_the_rest_are_stopped(rig, tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import ltpx.torch as lt\nlt.init()\n"
                      "if lt.rank() == 1:\n    raise RuntimeError('worker 1 breaks')\n"
                      "lt.shutdown()\n")
    rc, s, err = launch(2, "python", str(script), flags=("--grace", "1"))
    assert rc == 1 and s["exit_code"] == 1 and s["exit_from"] == ["w1"]   # w1's own code
    by = {r["label"]: r for r in s["ranks"]}
    assert by["w1"]["exit_code"] == 1 and not by["w1"]["killed"]
    assert "[w1] RuntimeError: worker 1 breaks" in err
    assert "[launch] worker 1 exited 1; the others are stopped in 1 s" in err
    # the others wait at the shutdown barrier for a worker that is gone: stopped
    assert by["w0"]["killed"] and by["s0"]["killed"]


@pytest.mark.rig
def test_a_rank_that_raises_is_named_as_the_root_cause_in_a_few_lines(rig, tmp_path):
    """A DDP script whose rank 1 raises at its sixth step: its traceback
    starts in the script (no launcher or runpy frames), no hang screen calls
    the crash a hang, the others are stopped at once (the default --grace
    0), and the summary's last block names the first failure with its
    error line, in torch's numbering; a handful of lines after the
    traceback, not a screenful."""
    script = tmp_path / "raise_ddp.py"
    script.write_text(
        "import torch, torch.distributed as dist, torch.nn.functional as F\n"
        "import ltpx.torch  # noqa: F401\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "dist.init_process_group('ltp')\n"
        "torch.manual_seed(0)\n"
        "model = DDP(torch.nn.Linear(32, 4))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(40):\n"
        "    loss = F.cross_entropy(model(torch.randn(16, 32)), torch.randint(0, 4, (16,)))\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
        "    if dist.get_rank() == 1 and step == 5:\n"
        "        raise RuntimeError('boom: a bad batch on rank 1')\n")
    out = subprocess.run([str(BIN / "ltp"), "launch", "--rig", RIG, "--workers", "3", "--",
                          "python", str(script)], capture_output=True, text=True, timeout=240,
                         cwd=ROOT)
    assert out.returncode == 1, out.stderr[-3000:]
    err = out.stderr.splitlines()
    tb = [i for i, ln in enumerate(err) if "Traceback (most recent call last)" in ln]
    assert tb and f"{script}" in err[tb[0] + 1], err          # the script's frame comes first
    assert not any("zygote.py" in ln or "runpy" in ln or "[hang]" in ln for ln in err), err
    last = max(i for i, ln in enumerate(err) if ln.endswith("RuntimeError: boom: a bad batch "
                                                           "on rank 1") and ln.startswith("[w1]"))
    assert len(err) - last <= 30, err[last:]
    assert "[launch] worker 1 exited 1; the others are stopped" in err
    assert err[-2:] == [err[-2], "  RuntimeError: boom: a bad batch on rank 1"]
    assert err[-2].startswith("root cause (first failure): w1 (rank 1) exited 1 after "), err
    rows = [ln for ln in err if ln.strip().startswith(("s0 ", "w0 ", "w1 ", "w2 "))]
    assert [ln.split()[:3] for ln in rows] == [["s0", "server", "0"], ["w0", "rank", "0"],
                                               ["w1", "rank", "1"], ["w2", "rank", "2"]], rows


@pytest.mark.rig
def test_documented_torchrun_command_inside_rig_namespaces(rig, tmp_path):
    # README / docs/training.md, as written, one command per host, each through
    # `ltp rig exec` (ip netns exec: a fresh /sys without bpffs)
    # (the job key every host is given: the store is off loopback, so a rank
    # without one refuses to start)
    hosts = [rig.ps, *rig.workers[:2]]
    key = tmp_path / "job.key"
    key.write_text(os.urandom(32).hex() + "\n")
    key.chmod(0o600)
    procs = [subprocess.Popen(
        [str(BIN / "ltp"), "rig", "exec", "--name", RIG, h.name, "--",
         str(BIN / "torchrun"), "--nnodes", "3", "--nproc-per-node", "1", "--node-rank", str(r),
         "--master-addr", rig.ps.ip, "--master-port", "29531",
         "-m", "ltpx.control.training", "--transport", "ltp", "--dev", h.ifname,
         "--capacity", "1e9", "--epochs", "1", "--seed", "0"],
        env=dict(os.environ, LTP_SECRET_FILE=str(key)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r, h in enumerate(hosts)]
    outs = finish_all(procs, timeout=240)
    result = json.loads(outs[1][0].strip().splitlines()[-1])     # worker 0 reports
    assert result["event"] == "result" and result["transport"] == "ltp"
    assert result["replicas_identical"] and result["workers"] == 2
    assert result["final_train_loss"] < result["initial_train_loss"]
    assert "mounted bpffs" in outs[0][1]                          # it was hidden, and mounted


@pytest.mark.rig
def test_a_named_rig_that_does_not_exist_is_built_and_said_so():
    """--rig with a new name (a typo, say) builds a fresh rig: a [launch] line
    says so with its settings before any rank starts, and it is removed."""
    from ltpx.dataplane.rig.star import Rig
    out = subprocess.run([str(BIN / "ltp"), "launch", "--rig", "i25typo", "--workers", "1",
                          "--servers", "0", "--loss", "0.01", "-j", "--", "true"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    first = out.stderr.splitlines()[0]
    assert first.startswith("[launch] building rig i25typo (no rig of that name exists)")
    assert "loss 0.01" in first
    assert json.loads(out.stdout)["rig"]["name"] == "i25typo" and not Rig.exists("i25typo")


@pytest.mark.rig
def test_a_ranks_own_exit_code_is_said_to_be_the_ranks(rig, tmp_path):
    # issue 25, item 3: a script's exit 2 is not ltp's usage error, and the
    # summary says whose code the launch exits with
    script = tmp_path / "two.py"
    script.write_text("import sys\nsys.exit(2)\n")
    out = subprocess.run([str(BIN / "ltp"), "launch", "--rig", RIG, "--workers", "1",
                          "--servers", "0", "--transport", "tcp", "--", "python", str(script)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "ltp launch: exit 2 (w0's own exit code)" in out.stderr, out.stderr[-2000:]
    assert "error:" not in out.stderr          # no usage error of ltp's


@pytest.mark.rig
@pytest.mark.parametrize("sig, code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_stopped_launch_says_who_it_stopped(rig, tmp_path, sig, code):
    # issue 25, item 4: SIGTERM and Ctrl-C end with the summary, not silence
    import signal
    import time
    script = tmp_path / "forever.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(600)\n")
    p = subprocess.Popen([str(BIN / "ltp"), "launch", "--rig", RIG, "--workers", "2",
                          "--servers", "0", "--transport", "tcp", "--", "python", str(script)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         preexec_fn=sigint_default)
    try:
        seen = []
        while len(seen) < 2:               # both ranks are up
            line = p.stdout.readline()
            assert line, p.stderr.read()[-2000:]
            if line.rstrip().endswith("] ready"):
                seen.append(line)
        time.sleep(0.2)
        p.send_signal(getattr(signal, sig))
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == code, err[-2000:]
    assert f"ltp launch: stopped by {sig} (w0, w1 stopped); exit {code}" in err, err[-2000:]
    assert "(stopped)" in err                  # the rank table follows
