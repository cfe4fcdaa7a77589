# SPDX-License-Identifier: Apache-2.0
"""FSDP2 over the `ltp` backend with CUDA tensors: a prepared GPU check.

    .venv/bin/python tests/gpu/test_fsdp_gpu.py       (prints JSON; exit 1 on a failure)
    .venv/bin/python -m pytest -q tests/gpu            (skips without CUDA)

docs/examples/fsdp2.py on cuda with two trainers and the LTP server on
loopback (ltpx.torch's TCP transport under the backend: no XDP needed):
FSDP2's parameter all-gathers and gradient reduce-scatters go over LTP with
CUDA tensors (staged through host memory), none over gloo; it checks that
every rank ends with the same parameters and compares with FSDP2 over gloo
(gloo built with CUDA; where it is not, the gloo arm's error is reported).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ddp_local import run_local  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs CUDA (a GPU machine): the GPU path is checked "
                                "there; the CPU tests run the same script on the CPU")
SCRIPT = Path(__file__).resolve().parent.parent.parent / "docs" / "examples" / "fsdp2.py"


def check() -> dict:
    args = ("--device", "cuda", "--iterations", "60")
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for name, backend in (("ltp", "ltp"), ("gloo", "gloo")):
        try:
            run = run_local(2, *args, backend=backend, script=SCRIPT)
        except Exception as e:   # noqa: BLE001 (gloo without CUDA: reported, not fatal)
            out[name] = {"error": f"{type(e).__name__}: {str(e)[-500:]}"}
            continue
        res = run["results"]
        out[name] = {"wall_s": run["wall_s"], "digests": sorted({r["digest"] for r in res}),
                     "accuracy": res[0]["accuracy"], "it_s": res[0]["iterations_per_s"],
                     "device": res[0]["device"], "routes": res[0]["routes"]}
    return out


@pytest.mark.slow
def test_fsdp2_over_ltp_on_cuda():
    out = check()
    print(json.dumps(out))
    ltp = out["ltp"]
    assert "error" not in ltp, out
    assert len(ltp["digests"]) == 1 and ltp["device"].startswith("cuda"), out
    assert ltp["routes"]["reduce_scatter_single tolerant"] > 0, out
    assert not [k for k in ltp["routes"] if k.endswith(" gloo")], out
    assert ltp["accuracy"] >= 0.8, out


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA"}))
        sys.exit(0)
    try:
        test_fsdp2_over_ltp_on_cuda()
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
