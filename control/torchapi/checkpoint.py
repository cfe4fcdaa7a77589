# SPDX-License-Identifier: Apache-2.0
"""Checkpoints for a job whose server may die: worker 0 writes them, every worker resumes from them.

The server holds no model and no optimizer: what it keeps between steps
(the round clock, Early Close's learned rates, "stale" filling's last
values) is rebuilt by a new job in a few rounds, and none of it changes
the parameters. The state that matters is the workers', and every replica
holds all of it, bit-identical (each steps its own optimizer with the same
answer). So worker 0 saves it: `save()` every N steps to
<dir>/ckpt-<tag>-<step>.pt (tag: a hash of the job's fingerprint). The file
is written under a temporary name unique to the writer's host and process
(`<name>.tmp.<host>.<pid>`), fsynced, renamed, and its folder fsynced, so a
kill or a power cut leaves the last good checkpoint. The last KEEP of this
fingerprint are kept. Jobs and hosts may share the folder: a job prunes only
its own fingerprint's files, and a temporary file is removed only when it is
this host's and its pid is gone, or when nobody has written to it for
STALE_S (any host's: a live writer finishes a file in far less). A save
that fails (a full disk, a folder gone or read-only) is a warning naming
the path and the error, and training goes on: the last good checkpoint stays.

A restarted job (every rank new: the server's death ends the job, and
`ltp train --restart` or torchrun --max-restarts starts it again) calls
`resume()` on every worker before its first op: worker 0 reads the newest
checkpoint whose fingerprint matches the job, and broadcasts it to the
others over LTP's reliable class (its length first, then its bytes in
pieces of PIECE_BYTES, so no op outgrows the largest round an endpoint
holds, 2^20 chunks), so only worker 0 needs the directory; everyone loads
the same bytes. Then the replicas are where they were at that step, and
training goes on from there on the same trajectory.
"""
from __future__ import annotations

import errno
import glob
import hashlib
import io
import logging
import os
import re
import socket
import time

import torch

from ...dataplane import files
from ...errors import CommError
from .collectives import broadcast_parameters
from .elastic import check_state, state_blob
from .job import current
from ..trust.sealing import StoreValueError

KEEP = 2
NAME = re.compile(r"ckpt-([0-9a-f]{16})-([0-9]+)\.pt")
TMP = ".pt.tmp."          # <name>.pt.tmp.<host>.<pid>
STALE_S = 3600.0          # a temporary file nobody wrote to for this long is abandoned
PIECE_BYTES = 1 << 24     # resume() broadcasts a checkpoint in pieces of this many bytes
STATE_SLACK = 1 << 26     # state_limit's room for what a script keeps in `extra`

log = logging.getLogger("ltpx.torch.checkpoint")


def tag_for(fingerprint: str) -> str:
    """The fingerprint as it appears in file names (any string: hashed)."""
    return hashlib.sha256(fingerprint.encode()).hexdigest()[:16]


def path_for(ckdir: str, step: int, fingerprint: str) -> str:
    return os.path.join(ckdir, f"ckpt-{tag_for(fingerprint)}-{step:08d}.pt")


def host_name() -> str:
    """This host as it appears in temporary file names."""
    return re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname()) or "host"


def temp_for(path: str) -> str:
    """The temporary name this process writes `path` under."""
    return f"{path[:-3]}{TMP}{host_name()}.{os.getpid()}"


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


def is_torn(tmp: str, now: float) -> bool:
    """Whether a temporary file's writer is gone: this host's with its pid
    dead, or anyone's (another host's, a name of another form) untouched for
    STALE_S."""
    host, _, pid = os.path.basename(tmp).split(TMP, 1)[-1].rpartition(".")
    if host == host_name() and pid.isdigit() and not pid_alive(int(pid)):
        return True
    try:
        return now - os.lstat(tmp).st_mtime > STALE_S
    except FileNotFoundError:   # renamed or removed meanwhile
        return False


def remove_torn(ckdir: str) -> None:
    """Temporary files whose writer died mid-write (is_torn; any job's)."""
    now = time.time()
    for torn in glob.glob(os.path.join(ckdir, f"ckpt-*{TMP}*")):
        if is_torn(torn, now):
            try:
                os.unlink(torn)
            except FileNotFoundError:   # another job removed it first
                pass


def fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: str, data) -> None:
    """`data` at `path` whole or not at all, on disk when this returns: a
    temporary file written and fsynced, renamed, its folder fsynced."""
    tmp = temp_for(path)
    try:
        with files.create(tmp) as f:      # 0600, never through a symlink
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:        # a failed or stopped write (SIGTERM) leaves no torn file
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(path) or ".")


def save(ckdir: str, opt, extra: dict, fingerprint: str) -> str | None:
    """Worker 0's checkpoint of this step; its path, or None when it could not
    be written (a warning names the path and the error; training goes on)."""
    path = path_for(ckdir, opt.steps, fingerprint)
    buf = io.BytesIO()   # serialized first: torch.save hides a write's errno
    torch.save({"fingerprint": fingerprint, "blob": state_blob(opt, extra, joiner=False)}, buf)
    try:
        os.makedirs(ckdir, exist_ok=True)
        remove_torn(ckdir)
        write_durably(path, buf.getbuffer())
        for old in checkpoints(ckdir, fingerprint)[KEEP:]:
            os.unlink(old)
    except OSError as e:
        code = errno.errorcode.get(e.errno, "?") if e.errno else "no errno"
        log.warning("ltpx.torch: checkpoint %s not saved: %s (%s); training goes on, "
                    "the last good checkpoint stays", path, e.strerror or e, code)
        return None
    return path


def state_limit(opt) -> int:
    """The most bytes a state of this model may take: its parameters and
    what an optimizer keeps per parameter (Adam: two moments) several times
    over, plus room for `extra`."""
    n = sum(p.numel() * p.element_size() for g in opt.param_groups for p in g["params"])
    return 8 * n + STATE_SLACK


def resume(opt, ckdir: str | None, fingerprint: str) -> dict | None:
    """Every worker, before its first op: the newest matching checkpoint, from
    worker 0 to all; its `extra` (None: there was none, start afresh)."""
    lead = current().rank == 0
    blob = b""
    if lead and ckdir:
        for path in checkpoints(ckdir, fingerprint):   # newest first; a torn one skipped
            try:
                ck = torch.load(path, weights_only=True, map_location="cpu")
            except Exception:
                continue
            if ck.get("fingerprint") == fingerprint:
                blob = ck["blob"]
                break
    n = torch.tensor([len(blob)], dtype=torch.int64)
    broadcast_parameters([n], root_rank=0)
    if int(n) == 0:
        return None
    if not lead and not 0 < int(n) <= state_limit(opt):
        raise CommError(f"worker 0 announced a checkpoint of {int(n)} bytes, more than this "
                        f"model's state can be ({state_limit(opt)}): refused")
    data = torch.frombuffer(bytearray(blob), dtype=torch.uint8) if lead else \
        torch.zeros(int(n), dtype=torch.uint8)
    for lo in range(0, int(n), PIECE_BYTES):   # each piece an op of its own size
        broadcast_parameters([data[lo:lo + PIECE_BYTES]], root_rank=0)
    return _load(opt, data.numpy().tobytes())


def _load(opt, blob: bytes) -> dict:
    """Parameters, optimizer state and step from a checkpoint's blob (the
    exchange's clock stays this job's own: a new job numbers ops afresh).
    Loaded on the CPU whatever device saved it: the copies into the
    parameters and the optimizer's load_state_dict move each value
    to its parameter's device, so a GPU job's checkpoint resumes anywhere."""
    params = [p for g in opt.param_groups for p in g["params"]]
    try:
        st = torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")
    except Exception as e:
        raise StoreValueError(f"the checkpoint worker 0 sent does not load: {e}") from None
    check_state(st, params, None)
    with torch.no_grad():
        for p, v in zip(params, st["params"]):
            p.copy_(v)
    opt.load_state_dict(st["optimizer"])
    opt.ltp.steps, opt.ltp.ks = st["steps"], list(st["ks"])
    extra = dict(st["extra"])
    extra["resumed_from"] = st["steps"]
    return extra
