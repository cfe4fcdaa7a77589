# SPDX-License-Identifier: Apache-2.0
"""ltpx.torch's own API with CUDA tensors: DistributedOptimizer, allreduce, digest.

    .venv/bin/python tests/gpu/test_ltpx_gpu.py       (prints JSON; exit 1 on a failure)
    .venv/bin/python -m pytest -q tests/gpu            (skips without CUDA)

tests/torch_api_job.py's cases (the ones test_torch_api.py runs on the CPU)
with every model on cuda:0 (JOB_DEVICE=cuda): a server and two workers on
loopback over ltpx.torch's TCP transport. The gradients go down into pinned
host memory with copies queued on the GPU's stream and the aggregate comes
back in one copy per bucket; the checks are the CPU run's: replicas
bit-identical, the exact cases equal to one process trained on the same
global batches (on the GPU too), half precision kept, unused layers
untouched, a NaN gradient contained, the no-overlap and wbsp paths
training, and an allreduce's mean on the tensor's device. Then
tests/checkpoint_job.py on cuda:0: a checkpoint saved from the GPU and
resumed (loaded on the CPU, moved back by the copies and the optimizer's
load_state_dict) gives the saved parameters, with the momentum on the GPU.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from test_checkpoint import check_resume  # noqa: E402
from test_torch_api import check_cases, start_local_job  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs CUDA (a GPU machine): the CPU tests run the "
                                "same cases with every copy on the host")

CASES = "set_to_none,keep_grads,fp16,bf16,unused,nonfinite,modes"


def check() -> dict:
    t0 = time.monotonic()
    outs = start_local_job(CASES, JOB_DEVICE="cuda")
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs[1:]]
    c = results[0]["cases"]
    return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "wall_s": round(time.monotonic() - t0, 2), "results": results,
            "max_diff_to_single": {k: c[k]["max_diff_to_single"]
                                   for k in ("set_to_none", "keep_grads")},
            "allreduce_device": [r["cases"]["modes"]["allreduce"]["device"] for r in results]}


@pytest.mark.slow
def test_ltpx_torch_on_cuda():
    out = check()
    print(json.dumps({k: v for k, v in out.items() if k != "results"}))
    check_cases(out["results"])
    assert out["allreduce_device"] == ["cuda", "cuda"], out["allreduce_device"]
    for r in out["results"]:
        nf = r["cases"]["nonfinite"]
        assert nf["finite"] and nf["reports"][2] == [1], nf


@pytest.mark.slow
def test_checkpoint_saved_on_cuda_resumes_there(tmp_path):
    w0, _ = check_resume(tmp_path, JOB_DEVICE="cuda")
    print(json.dumps({"checkpoint": {k: w0[k] for k in ("size", "ops", "devices",
                                                         "state_devices")}}))
    assert w0["devices"] == w0["state_devices"] == ["cuda"], w0


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA"}))
        sys.exit(0)
    try:
        test_ltpx_torch_on_cuda()
        with tempfile.TemporaryDirectory() as d:
            test_checkpoint_saved_on_cuda_resumes_there(d)
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
