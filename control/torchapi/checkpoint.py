# SPDX-License-Identifier: Apache-2.0
"""Checkpoints for a job whose server may die: worker 0 writes them, every worker resumes from them.

The server holds no model and no optimizer: what it keeps between steps
(the round clock, Early Close's learned rates, "stale" filling's last
values) is rebuilt by a new job in a few rounds, and none of it changes
the parameters. The state that matters is the workers', and every replica
holds all of it, bit-identical (each steps its own optimizer with the same
answer). So worker 0 saves it: `save()` every N steps to
<dir>/ckpt-<tag>-<step>.pt (tag: a hash of the job's fingerprint), written
to a temporary name with the writer's pid and renamed (a kill mid-write
leaves the last good one), the last KEEP of this fingerprint kept. Jobs
may share the folder: a job prunes only its own files, and removes a temp
file only when the pid in its name is gone.

A restarted job (every rank new: the server's death ends the job, and
`ltp train --restart` or torchrun --max-restarts starts it again) calls
`resume()` on every worker before its first op: worker 0 reads the newest
checkpoint whose fingerprint matches the job, and broadcasts it to the
others over LTP's reliable class (its length first, then its bytes), so
only worker 0 needs the directory; everyone loads the same bytes. Then the
replicas are where they were at that step, and training goes on from there
on the same trajectory.
"""
from __future__ import annotations

import glob
import hashlib
import io
import os
import re

import torch

from .collectives import broadcast_parameters
from .elastic import state_blob
from .job import current

KEEP = 2
NAME = re.compile(r"ckpt-([0-9a-f]{16})-([0-9]+)\.pt")


def tag_for(fingerprint: str) -> str:
    """The fingerprint as it appears in file names (any string: hashed)."""
    return hashlib.sha256(fingerprint.encode()).hexdigest()[:16]


def path_for(ckdir: str, step: int, fingerprint: str) -> str:
    return os.path.join(ckdir, f"ckpt-{tag_for(fingerprint)}-{step:08d}.pt")


def checkpoints(ckdir: str, fingerprint: str | None = None) -> list[str]:
    """ckdir's checkpoints (of this fingerprint), newest first, by name alone."""
    tag = tag_for(fingerprint) if fingerprint is not None else "*"
    found = []
    for path in glob.glob(os.path.join(ckdir, f"ckpt-{tag}-*.pt")):
        m = NAME.fullmatch(os.path.basename(path))
        if m:
            found.append((int(m.group(2)), path))
    return [p for _, p in sorted(found, reverse=True)]


def latest(ckdir: str, fingerprint: str | None = None) -> str | None:
    """The newest checkpoint in ckdir (of this fingerprint), or None."""
    found = checkpoints(ckdir, fingerprint)
    return found[0] if found else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process
        return True
    return True


def remove_torn(ckdir: str) -> None:
    """Temporary files whose writer died mid-write (any job's; a live writer's stay)."""
    for torn in glob.glob(os.path.join(ckdir, "ckpt-*.pt.tmp.*")):
        pid = torn.rsplit(".", 1)[1]
        if pid.isdigit() and not pid_alive(int(pid)):
            try:
                os.unlink(torn)
            except FileNotFoundError:   # another job removed it first
                pass


def save(ckdir: str, opt, extra: dict, fingerprint: str) -> str:
    """Worker 0's checkpoint of this step (atomic: temporary file, rename)."""
    os.makedirs(ckdir, exist_ok=True)
    path = path_for(ckdir, opt.steps, fingerprint)
    tmp = f"{path}.tmp.{os.getpid()}"
    remove_torn(ckdir)
    try:
        torch.save({"fingerprint": fingerprint, "blob": state_blob(opt, extra)}, tmp)
        os.replace(tmp, path)
    except BaseException:        # stopped mid-write (SIGTERM): leave no torn file
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    for old in checkpoints(ckdir, fingerprint)[KEEP:]:
        os.unlink(old)
    return path


def resume(opt, ckdir: str | None, fingerprint: str) -> dict | None:
    """Every worker, before its first op: the newest matching checkpoint, from
    worker 0 to all; its `extra` (None: there was none, start afresh)."""
    lead = current().rank == 0
    blob = b""
    if lead and ckdir:
        for path in checkpoints(ckdir, fingerprint):   # newest first; a torn one skipped
            try:
                ck = torch.load(path, weights_only=True)
            except Exception:
                continue
            if ck.get("fingerprint") == fingerprint:
                blob = ck["blob"]
                break
    n = torch.tensor([len(blob)], dtype=torch.int64)
    broadcast_parameters([n], root_rank=0)
    if int(n) == 0:
        return None
    data = torch.frombuffer(bytearray(blob), dtype=torch.uint8) if lead else \
        torch.zeros(int(n), dtype=torch.uint8)
    broadcast_parameters([data], root_rank=0)
    return _load(opt, data.numpy().tobytes())


def _load(opt, blob: bytes) -> dict:
    """Parameters, optimizer state and step from a checkpoint's blob (the
    exchange's clock stays this job's own: a new job numbers ops afresh)."""
    st = torch.load(io.BytesIO(blob), weights_only=True)
    with torch.no_grad():
        for p, v in zip([p for g in opt.param_groups for p in g["params"]], st["params"]):
            p.copy_(v)
    opt.inner.load_state_dict(st["optimizer"])
    opt.steps, opt.ks = st["steps"], list(st["ks"])
    extra = dict(st["extra"])
    extra["resumed_from"] = st["steps"]
    return extra
