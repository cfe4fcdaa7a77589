# SPDX-License-Identifier: Apache-2.0
"""DDP over the `ltp` backend with CUDA tensors: the one prepared GPU check.

    .venv/bin/python tests/gpu/test_ddp_gpu.py        (prints JSON; exit 1 on a failure)
    .venv/bin/python -m pytest -q tests/gpu            (skips without CUDA)

Two trainers and the LTP server on loopback (ltpx.torch's TCP transport
under the backend: no XDP needed), the model and its gradients on cuda:0:
the buckets go through pinned host buffers on a side stream and back. It
checks that the replicas are bit-identical, that an exact all_reduce and
max are equal on every rank, and reports whether the digests equal the same
job's over gloo (not asserted: a GPU's kernels need not give the same
gradients twice) and with co-located servers (one per trainer,
LTP_SERVERS=2: no server hosts).
"""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ddp_local import run_local  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs CUDA (a GPU machine): the GPU path is checked "
                                "there; the CPU tests run every step of it but the copies")


def check() -> dict:
    args = ("--device", "cuda", "--epochs", "3")
    ltp = run_local(2, *args)
    hook = run_local(2, *args, "--hook")
    colocated = run_local(2, *args, env_extra={"LTP_SERVERS": "2"})
    gloo = run_local(2, *args, backend="gloo")
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for name, run in (("ltp", ltp), ("ltp_hook", hook), ("ltp_colocated", colocated),
                      ("gloo", gloo)):
        res = run["results"]
        out[name] = {"wall_s": run["wall_s"], "digests": sorted({r["digest"] for r in res}),
                     "accuracy": res[0]["accuracy"], "device": res[0]["device"],
                     "metric_equal": len({(r["accuracy"], r["worst_loss"]) for r in res}) == 1}
    out["ltp_equals_gloo"] = out["ltp"]["digests"] == out["gloo"]["digests"] == \
        out["ltp_colocated"]["digests"]
    return out


@pytest.mark.slow
def test_ddp_over_ltp_on_cuda():
    out = check()
    print(json.dumps(out))
    for name in ("ltp", "ltp_hook", "ltp_colocated", "gloo"):
        assert len(out[name]["digests"]) == 1, (name, out)        # replicas bit-identical
        assert out[name]["metric_equal"], (name, out)             # exact collectives agree
        assert out[name]["device"].startswith("cuda"), out
    assert out["ltp"]["accuracy"] >= 0.8, out


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA"}))
        sys.exit(0)
    try:
        test_ddp_over_ltp_on_cuda()
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
