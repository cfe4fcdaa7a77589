# SPDX-License-Identifier: Apache-2.0
"""Crash-safe checkpoints (control/torchapi/checkpoint.py): written durably
(file fsynced before its rename, folder after), temporary names per host and
process, a failed save a warning and not the end of worker 0, and a resume
in pieces no larger than PIECE_BYTES (no op outgrows an endpoint's 2^20
chunks). The save tests (unit) give `save` a fixed blob in place of a job's state
(elastic.state_blob needs a running job); the resume test (slow) runs a real
job over TCP on loopback."""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import finish_all

JOB = Path(__file__).resolve().parent / "checkpoint_job.py"


class _Steps:
    def __init__(self, steps: int):
        self.steps = steps


@pytest.fixture
def checkpoint(monkeypatch):
    from ltpx.control.torchapi import checkpoint as ck
    monkeypatch.setattr(ck, "state_blob", lambda opt, extra, joiner: b"state" * 100)
    return ck


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.unit
def test_a_temp_file_is_removed_only_when_its_writer_is_gone(checkpoint, tmp_path):
    """This host's temp file with a dead pid goes; one with a live pid stays;
    another host's stays whatever its pid, until nobody wrote to it for
    STALE_S; so does a temp name of another form."""
    tag, me = checkpoint.tag_for("b"), checkpoint.host_name()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = _dead_pid()
    name = f"ckpt-{tag}-00000020.pt.tmp."
    files = {"mine_dead": f"{name}{me}.{dead}", "mine_live": f"{name}{me}.{live.pid}",
             "other_host": f"{name}other-{me}.{dead}", "other_old": f"{name}node7.example.{dead}",
             "bare_pid": f"{name}{dead}", "bare_old": f"{name}{live.pid}"}
    try:
        for f in files.values():
            (tmp_path / f).write_bytes(b"half")
        old = time.time() - checkpoint.STALE_S - 60
        for f in ("other_old", "bare_old"):
            os.utime(tmp_path / files[f], (old, old))
        checkpoint.remove_torn(str(tmp_path))
    finally:
        live.kill()
        live.wait()
    left = {k for k, f in files.items() if (tmp_path / f).exists()}
    assert left == {"mine_live", "other_host", "bare_pid"}


@pytest.mark.slow          # strace and a torch import: ~6 s
def test_save_fsyncs_the_file_before_its_rename_and_the_folder_after(tmp_path):
    """Traced by strace in a child process: fsync(temp file), rename, fsync(folder)."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed")
    code = ("import sys; from ltpx.control.torchapi import checkpoint as c\n"
            "c.state_blob = lambda opt, extra, joiner: b'state'\n"
            "class S: steps = 7\n"
            "print(c.save(sys.argv[1], S(), {}, 'fp'))\n")
    log = tmp_path / "trace"
    ckdir = tmp_path / "ck"
    out = subprocess.run([strace, "-f", "-y", "-qq", "-o", str(log), "-e",
                          "trace=fsync,rename,renameat,renameat2", sys.executable, "-c", code,
                          str(ckdir)], capture_output=True, text=True, timeout=120)
    if out.returncode and "ptrace" in out.stderr:
        pytest.skip(f"strace cannot trace here: {out.stderr.strip()[-200:]}")
    assert out.returncode == 0, out.stderr[-2000:]
    final = out.stdout.strip().splitlines()[-1]
    assert final.startswith(str(ckdir)) and os.path.exists(final)
    calls = [line.split(None, 1)[1] for line in log.read_text().splitlines()
             if str(ckdir) in line and "resumed" not in line]
    kinds = [c.split("(")[0] for c in calls]
    assert len(kinds) == 3 and kinds[0] == "fsync" and kinds[1].startswith("rename") \
        and kinds[2] == "fsync", calls
    assert ".pt.tmp." in calls[0] and f"<{ckdir}>" in calls[2], calls


@pytest.mark.unit
def test_a_failed_save_warns_naming_path_and_errno_and_training_goes_on(checkpoint, tmp_path,
                                                                     caplog, monkeypatch):
    """A full disk (the temporary file's writes go to /dev/full: ENOSPC; a
    symlink planted there is no longer followed, dataplane/files.py) and a
    folder that is a file (EEXIST): save returns None with a warning, leaves
    no temp file, and keeps the last good checkpoint."""
    good = checkpoint.save(str(tmp_path), _Steps(5), {}, "fp")
    assert good and os.path.exists(good)
    path = checkpoint.path_for(str(tmp_path), 10, "fp")
    tmp = checkpoint.temp_for(path)
    with caplog.at_level(logging.WARNING, logger="ltpx.torch.checkpoint"), \
            monkeypatch.context() as m:
        m.setattr(checkpoint.files, "create", lambda p, binary=True, **kw: open("/dev/full", "wb"))
        assert checkpoint.save(str(tmp_path), _Steps(10), {}, "fp") is None
    assert path in caplog.text and "ENOSPC" in caplog.text, caplog.text
    assert not os.path.lexists(tmp) and not os.path.exists(path)
    assert checkpoint.latest(str(tmp_path), "fp") == good
    caplog.clear()
    afile = tmp_path / "not-a-folder"
    afile.write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="ltpx.torch.checkpoint"):
        assert checkpoint.save(str(afile), _Steps(10), {}, "fp") is None
    assert str(afile) in caplog.text and "EEXIST" in caplog.text, caplog.text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_resume(ckdir, **env_extra: str) -> list[dict]:
    """Run checkpoint_job.py (a server and two workers over TCP on loopback) in
    ckdir and check what every run of it must show; each worker's line."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               WORLD_SIZE="3", LTP_TRANSPORT="tcp", LTP_IP="127.0.0.1", OMP_NUM_THREADS="1",
               TORCH_CPP_LOG_LEVEL="ERROR", CKPT_PIECE="512",
               **{"LTP_SERVERS": "1", **env_extra})   # rank 0 a server rank
    procs = [subprocess.Popen([sys.executable, str(JOB), str(ckdir)], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(3)]
    outs = finish_all(procs, timeout=240)
    w0, w1 = (json.loads(out.strip().splitlines()[-1]) for out, _ in outs[1:])
    assert w0["size"] > 512 * 4
    assert w0["ops"] == w1["ops"] == 1 + math.ceil(w0["size"] / 512)
    assert w0["resumed"] == w1["resumed"] == w0["saved"]
    assert w0["steps"] == w1["steps"] == 3
    assert w0["extra"] == w1["extra"] == {"note": "three steps", "resumed_from": 3}
    # resumed where the model lives: parameters and the optimizer's momentum
    assert w0["state_devices"] == w1["state_devices"] == w0["devices"] == w1["devices"]
    return [w0, w1]


@pytest.mark.root          # the TCP link sets cubic, which only root may set here
@pytest.mark.slow
def test_resume_broadcasts_a_checkpoint_in_pieces_of_piece_bytes(tmp_path):
    """Two workers over TCP: worker 0 saves, both move their parameters apart,
    resume() with PIECE_BYTES=512 gives both the saved parameters and step in
    1 + ceil(size / 512) ops (the length, then the pieces)."""
    w0, _ = check_resume(tmp_path)
    assert w0["devices"] == ["cpu"]
