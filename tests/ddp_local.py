# SPDX-License-Identifier: Apache-2.0
"""A DDP job over the `ltp` backend on this host's loopback, no rig and no root:
the LTP job's server rank and N trainers as processes, with `ltpx.torch`'s TCP
transport under the backend (LTP_TRANSPORT=tcp), so the backend, the
tolerant bucket path and its device staging run end to end. The store is
hosted here (every rank a client, as under torchrun's agent).

tests/test_ddp_backend.py runs it on the CPU; tests/gpu/test_ddp_gpu.py on
CUDA tensors (and prints what docs/benchmarks.md quotes).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from conftest import outputs

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "docs" / "examples" / "ddp_backend.py"


def run_local(workers: int, *args: str, backend: str = "ltp", timeout: float = 300,
              env_extra: dict | None = None, script: Path = EXAMPLE,
              rank_env: dict[int, dict] | None = None) -> dict:
    """Run the example (or `script`, a variant of it) on loopback:
    {"results": each trainer's JSON line, "wall_s"}. `rank_env`: more
    environment for some trainers (by rank). LTP_SERVERS in `env_extra`
    starts that many servers (one per trainer: the co-located shape, every
    rank on this host); LTP_COLOCATE=1 none (each trainer serves a slice in
    its own process)."""
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=timeout),
                          wait_for_workers=False)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
               TORCHELASTIC_USE_AGENT_STORE="True", WORLD_SIZE=str(workers),
               LTP_TRANSPORT="tcp", LTP_IP="127.0.0.1", OMP_NUM_THREADS="1",
               TORCH_CPP_LOG_LEVEL="ERROR", GLOO_SOCKET_IFNAME="lo", LTP_SERVERS="1")
    env.update(env_extra or {})       # over the defaults above (LTP_IP too)
    for k in ("LTP_RANK", "LTP_ROLE", "LTP_WORLD_SIZE", "LTP_DEV", "LTP_NETNS",
              "LTP_STORE_NETNS"):
        env.pop(k, None)
    cmd = [sys.executable, str(script), "--backend", backend, *args]
    envs = [dict(env, RANK=str(r), LOCAL_RANK=str(r), **(rank_env or {}).get(r, {}))
            for r in range(workers)]
    colocated = env.get("LTP_COLOCATE", "0") not in ("", "0")   # trainers serve: none apart
    servers = int(env["LTP_SERVERS"]) if backend == "ltp" and not colocated else 0
    # the servers: the same script, LTP ranks 0..servers-1
    envs[:0] = [dict(env, RANK="0", LOCAL_RANK="0", LTP_ROLE="server", LTP_RANK=str(i),
                     LTP_WORLD_SIZE=str(workers + servers)) for i in range(servers)]
    t0 = time.monotonic()
    procs = [subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT) for e in envs]
    outs = outputs(procs, timeout)
    wall = time.monotonic() - t0
    aborts, failed = 0, []
    for rank, (p, (out, err)) in enumerate(zip(procs, outs)):
        # PyTorch's gloo sometimes aborts a process at exit, after
        # destroy_process_group (std::terminate from a thread still joinable at
        # its teardown: seen with backend gloo alone, ~1 run in 10 on 2 busy
        # cores). A rank that printed its result first did all its work: the
        # abort is counted, not failed; any other exit is a failure.
        if (p.returncode == -6 and '"event": "result"' in out
                and err.rstrip().endswith("terminate called without an active exception")):
            aborts += 1
            continue
        if p.returncode != 0:   # every failed process's words: the first is often a victim
            failed.append(f"--- process {rank} exited {p.returncode}:\n{err[-2000:]}")
    assert not failed, "\n".join(failed)
    trainers = outs[servers:]
    return {"results": [json.loads(o.strip().splitlines()[-1]) for o, _ in trainers],
            "wall_s": round(wall, 2), "teardown_aborts": aborts}
