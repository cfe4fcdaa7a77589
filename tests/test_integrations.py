# SPDX-License-Identifier: Apache-2.0
"""PyTorch Lightning and Hugging Face Accelerate (issue 43), and FSDP2
(issue 41), over the `ltp` backend: stock scripts (tests/lightning_job.py,
tests/accelerate_job.py, tests/fsdp_job.py) whose only LTP part is the
backend's name.

- on loopback (tests/ddp_local.py: the LTP job's server and two trainers as
  processes, LTP's TCP transport), each against the same script over gloo:
  bit-identical replicas, and the same parameters as gloo's;
- on a rig under `ltp launch` (the XDP path, its server rank started by the
  launcher, torchrun's variables set as torchrun sets them, TORCHELASTIC_RUN_ID
  included, which Lightning reads), against `--servers 0` over gloo:
  replicas bit-identical, accuracy within 0.5 pp of gloo's.

FSDP2's DeviceMesh looks the group up by its name, which the backend's
group keeps itself (torch keeps names on a group's C++ backends, and a
Python group has none); its reduce-scatters go over LTP's tolerant class,
its all-gathers over the reliable one, and with two trainers and nothing
lost its result is gloo's.
Lightning averages its logged metrics with ReduceOp.AVG, an integer batch
count among them: the backend's exact AVG takes integers (truncated, as
NCCL's). Accelerate on the CPU adopts a process group made before it, which
is how a script picks `ltp` there.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import requires_bpf, run_stopping

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
JOBS = {"lightning": ROOT / "tests" / "lightning_job.py",
        "accelerate": ROOT / "tests" / "accelerate_job.py",
        "fsdp2": ROOT / "tests" / "fsdp_job.py"}
MODULES = {"lightning": "pytorch_lightning", "accelerate": "accelerate"}
RUN = {"lightning": ("--epochs", "2"), "accelerate": ("--epochs", "2"), "fsdp2": ("--steps", "20")}


def _needs(framework: str) -> None:
    if framework not in MODULES:      # torch's own
        return
    pytest.importorskip(MODULES[framework],
                        reason=f"{framework} is not installed: bash scripts/setup.sh installs "
                               "the integrations extra")


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("framework", ["lightning", "accelerate"])
def test_a_framework_script_on_loopback_trains_as_over_gloo(framework):
    _needs(framework)
    from ddp_local import run_local
    # as torchrun sets them for two processes on one host (Lightning reads them)
    extra = {"TORCHELASTIC_RUN_ID": "itest", "GROUP_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    runs = {b: run_local(2, *RUN[framework], backend=b, script=JOBS[framework],
                         env_extra=extra)["results"] for b in ("ltp", "gloo")}
    ltp, gloo = runs["ltp"], runs["gloo"]
    assert [r["rank"] for r in ltp] == [0, 1] and {r["world"] for r in ltp} == {2}
    assert {r["backend"] for r in ltp} == {"ltp"} and {r["backend"] for r in gloo} == {"gloo"}
    assert len({r["digest"] for r in ltp}) == 1
    assert ltp[0]["digest"] == gloo[0]["digest"], (ltp, gloo)
    assert ltp[0]["accuracy"] == gloo[0]["accuracy"] > 0.5


@pytest.mark.root
@pytest.mark.slow
def test_fsdp2_over_ltp_is_gloos_bit_for_bit():
    """FSDP2's `fully_shard` over `ltp` (tests/fsdp_job.py): its DeviceMesh finds
    the group by its name, its gradient reduce-scatters go over LTP's tolerant
    class and its parameter all-gathers over the reliable one, none over
    gloo; with two trainers and nothing lost the server's mean is gloo's, so
    every trainer ends with gloo's parameters."""
    from ddp_local import run_local
    ltp = run_local(2, *RUN["fsdp2"], script=JOBS["fsdp2"])["results"]
    gloo = run_local(2, *RUN["fsdp2"], backend="gloo", script=JOBS["fsdp2"])["results"]
    assert {r["backend"] for r in ltp} == {"ltp"} and [r["rank"] for r in ltp] == [0, 1]
    assert {r["digest"] for r in ltp} == {r["digest"] for r in gloo} and \
        len({r["digest"] for r in ltp}) == 1
    assert [r["loss"] for r in ltp] == [r["loss"] for r in gloo]
    for r in ltp:       # 20 steps, 2 units with parameters: a reduce-scatter each, tolerant
        routes = r["routes"]
        assert routes["reduce_scatter_single tolerant"] == routes["reduce_scatter_single ltp"] \
            == 40 and routes["all_gather_single ltp"] >= 40, routes
        assert not [k for k in routes if k.endswith(" gloo")], routes


@pytest.mark.root
@pytest.mark.slow
def test_the_fsdp2_example_on_loopback_trains_as_over_gloo():
    """docs/examples/fsdp2.py (what scripts/fsdp_ab.sh and tests/gpu run), on
    the CPU over loopback: every rank the same parameters, gloo's accuracy,
    and no call of the `ltp` group over gloo."""
    from ddp_local import run_local
    script = ROOT / "docs" / "examples" / "fsdp2.py"
    ltp = run_local(2, "--iterations", "40", script=script)["results"]
    gloo = run_local(2, "--iterations", "40", script=script, backend="gloo")["results"]
    assert len({r["digest"] for r in ltp}) == 1 and ltp[0]["device"] == "cpu"
    assert abs(ltp[0]["accuracy"] - gloo[0]["accuracy"]) <= 0.005 and ltp[0]["accuracy"] > 0.8
    routes = ltp[0]["routes"]
    assert routes["reduce_scatter_single tolerant"] == 3 * 40, routes   # 3 layers a step
    assert not [k for k in routes if k.endswith(" gloo")], routes


def _launch(framework: str, *flags: str, backend: str = "ltp") -> list[dict]:
    out = run_stopping([str(BIN / "ltp"), "launch", "--workers", "2", *flags, "-j", "--",
                        "python", str(JOBS[framework]), *RUN[framework], "--backend", backend],
                       timeout=400, cwd=ROOT, env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    res = [r["last_json"] for r in summary["ranks"] if r["role"] == "worker"]
    assert all(r is not None for r in res), out.stderr[-3000:]
    return res


@requires_bpf
@pytest.mark.rig
@pytest.mark.slow
@pytest.mark.parametrize("framework", ["lightning", "accelerate", "fsdp2"])
def test_a_framework_script_under_ltp_launch_trains_as_over_gloo(framework):
    _needs(framework)
    ltp = _launch(framework)
    gloo = _launch(framework, "--servers", "0", backend="gloo")
    assert [r["rank"] for r in ltp] == [0, 1] and {r["backend"] for r in ltp} == {"ltp"}
    assert len({r["digest"] for r in ltp}) == 1 and len({r["digest"] for r in gloo}) == 1
    if framework == "fsdp2":      # two trainers, nothing lost: gloo's parameters
        assert ltp[0]["digest"] == gloo[0]["digest"]
        assert ltp[0]["routes"]["reduce_scatter_single tolerant"] == 40, ltp[0]["routes"]
    else:
        assert abs(ltp[0]["accuracy"] - gloo[0]["accuracy"]) <= 0.005, (ltp[0], gloo[0])
