# SPDX-License-Identifier: Apache-2.0
"""A fork server for ranks: torch imported once, each rank a fork of it (the launcher's side).

A rank started as a new interpreter spends 2-3 s of CPU before it does
anything (torch, torch._dynamo that torch.optim's step imports, the
transport stack), and a job on a 2-core machine starts five or more at once.
So the launcher starts one zygote early (`warm()`, while the rig is being
built: its imports run on the other core) that imports all of it before
any thread exists (zygote.py), and asks it for each rank:

  launcher (Zygote.spawn)                      zygote (python -m ...zygote)
    pipes for stdout/stderr, a status socket
    ---- control socket, SCM_RIGHTS ---------> fork(); the child enters the
                                               netns, dup2s the pipes, takes the
                                               env, argv and cwd, runs the rank
                                               as __main__ (runpy)
    ZygoteProc <--- status: {"pid"} ---------- the zygote waits for it (pidfd)
               <--- status: {"exit": code} ---
               ---- status: {"signal": n} ---> os.kill (not yet reaped: no pid reuse)

`ZygoteProc` is used as a subprocess.Popen (pid, stdout, stderr, poll, wait,
returncode, send_signal, terminate, kill), so RigJob, control/training/faults.py
and stop_all treat both alike. Lifetimes: the zygote dies with the launcher's thread that
started it (PR_SET_PDEATHSIG) and each child with the zygote; closing the
control socket (Zygote.close) makes the zygote SIGKILL and reap what is
left and exit; a child whose status socket closes is SIGKILLed.

Falling back to a new interpreter (netns.popen): LTP_FORKSERVER=0; a
command that is not this interpreter running a module (-m) or a script
with no other options; a rank whose environment differs from the zygote's
in a variable read at import time (IMPORT_TIME: OMP_*, TORCH_*, PYTHON*,
...); a rank whose request (argv and environment) is too large for the
control socket (EMSGSIZE: a note, that rank only); and any failure of the
zygote (one line on stderr, then every later rank of that zygote starts as
a new interpreter).
"""
from __future__ import annotations

import atexit
import errno
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

from .. import settings_table

ENV_SWITCH = settings_table.TABLE["forkserver"].env   # LTP_FORKSERVER=0: new interpreters
ZYGOTE_MODULE = "ltpx.control.launcher.zygote"
STORE_MODULE = "ltpx.control.launcher.storehost"   # the job's store host (storehost.py)
# set in the zygote before it imports, and in every rank's environment alike
IMPORT_ENV = {"OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR", "PYTHONUNBUFFERED": "1"}
# what a rank of an ltpx.torch script imports, in this order (a module missing
# here is skipped); a caller adds its own ranks' modules (`also`: `ltp train`'s
# job, control/training's RANK_MODULES), so the launcher names none above it
PRELOAD = ("numpy", "torch", "torch.optim", "torch._dynamo", "torch.distributed", "bcc",
           "pyroute2", "ltpx.torch", "ltpx.control.transport.endpoint",
           "ltpx.dataplane.xdp.loader")
# environment variables read while importing (torch, OpenMP, the interpreter, the
# loader, ltpx's store keys): a rank that wants other values than the zygote's
# starts as a new interpreter. PYTHONUNBUFFERED is the child's own to apply.
# No LTP_* variable is among them: ltpx reads its own (settings_table.env,
# Settings) at run time, after the fork gave the rank its environment
# (tests/test_structure.py keeps settings_table.env out of import time).
IMPORT_TIME = ("OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH_", "PYTORCH",
               "TORCHDYNAMO", "TORCHINDUCTOR", "TORCHELASTIC_RESTART_COUNT", "PYTHON", "LD_",
               "MALLOC_", "CUDA")
NOT_IMPORT_TIME = ("PYTHONUNBUFFERED",)
READY_S = 120.0         # the zygote's imports, on a loaded machine
REPLY_S = 30.0          # a fork's pid
MSG_MAX = 1 << 20


def enabled() -> bool:
    return settings_table.env("forkserver")


def note(text: str) -> None:
    print(f"note: fork server: {text}", file=sys.stderr, flush=True)


def plan(argv: list[str]) -> tuple[str, str, list[str]] | None:
    """("module", name, args) for `python -m name args`, ("script", path, args)
    for `python path args` (python = this interpreter, as launch.python_argv
    makes it); None for anything else (options, -c, another program)."""
    if len(argv) < 2 or os.path.abspath(argv[0]) != os.path.abspath(sys.executable):
        return None
    if argv[1] == "-m":
        return ("module", argv[2], list(argv[3:])) if len(argv) > 2 else None
    if argv[1].startswith("-"):
        return None
    return "script", argv[1], list(argv[2:])


def import_time_differences(env: dict, base: dict) -> list[str]:
    keys = {k for k in (*env, *base) if k.startswith(IMPORT_TIME) and k not in NOT_IMPORT_TIME}
    return sorted(k for k in keys if env.get(k) != base.get(k))


def recv_status(sock: socket.socket) -> bytes:
    """A message from the zygote on a status socket; b"" when it is closed.
    A reset is the zygote closing its end with our last signal order unread
    (the child had exited): its exit message still waits behind it."""
    try:
        return sock.recv(4096)
    except ConnectionResetError:
        try:
            return sock.recv(4096, socket.MSG_DONTWAIT)
        except OSError:
            return b""
    except OSError:
        return b""


class ZygoteProc:
    """A process forked by the zygote, as a subprocess.Popen: the zygote is
    its parent, so its exit status and signals go through the status socket."""

    stdin = None

    def __init__(self, args: list[str], pid: int, status: socket.socket, stdout, stderr):
        self.args, self.pid, self.status = args, pid, status
        self.stdout, self.stderr = stdout, stderr
        self.returncode: int | None = None

    def __repr__(self) -> str:
        return f"<ZygoteProc pid {self.pid} returncode {self.returncode}>"

    def _hear(self, wait_s: float | None) -> None:
        """Take the zygote's word on this child, waiting up to wait_s (None: until it comes)."""
        if self.returncode is not None:
            return
        if not select.select([self.status], [], [], wait_s)[0]:
            return
        data = recv_status(self.status)
        if data:
            msg = json.loads(data)
            if "exit" not in msg:
                return
            self.returncode = int(msg["exit"])
        else:   # the zygote is gone, and its children with it (PR_SET_PDEATHSIG)
            self.returncode = -signal.SIGKILL
        self.status.close()

    def poll(self) -> int | None:
        self._hear(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._hear(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                self.status.send(json.dumps({"signal": int(sig)}).encode())
            except OSError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The zygote process, started now; its imports run while the caller goes on."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD):
        self.env = dict(os.environ, **IMPORT_ENV)
        self.log = tempfile.TemporaryFile()
        self.ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", ZYGOTE_MODULE, str(theirs.fileno()), str(os.getpid()),
                 ",".join(preload)], pass_fds=(theirs.fileno(),), env=self.env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log)
        except OSError:
            self.ctl.close()
            self.log.close()
            raise
        finally:
            theirs.close()
        self.info: dict | None = None
        self.broken: str | None = None
        self.warned: set[str] = set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ready(self, timeout: float = READY_S) -> bool:
        """Wait until its imports are done; False (after a note) if it failed."""
        if self.info is not None or self.broken:
            return self.info is not None
        try:
            data = self.ctl.recv(MSG_MAX) if select.select([self.ctl], [], [], timeout)[0] \
                else None
        except OSError:
            data = b""
        if data is None:
            self.fail(f"not ready after {timeout:g} s")
            return False
        msg = json.loads(data) if data else {"error": self.last_words()}
        if not msg.get("ready"):
            self.fail(msg.get("error") or "it exited")
            return False
        self.info = msg
        return True

    def spawn(self, argv: list[str], env: dict, netns: str | None = None,
              cwd: str | None = None) -> ZygoteProc | None:
        """Fork a child running argv (module or script) in network namespace
        `netns` with exactly `env`; None when this command cannot be forked
        here (the caller starts a new interpreter)."""
        how = plan(argv)
        if how is None or not self.ready():
            return None
        differ = import_time_differences(env, self.env)
        if differ:
            if tuple(differ) not in self.warned:
                self.warned.add(tuple(differ))
                note(f"{', '.join(differ)} differ(s) from the zygote's, which are read at "
                     "import: such ranks start as new processes")
            return None
        req = {"how": how[0], "target": how[1], "args": how[2], "argv": list(argv),
               "env": dict(env), "cwd": cwd or os.getcwd(), "netns": netns}
        return self._fork(argv, json.dumps(req).encode())

    def _fork(self, argv: list[str], req: bytes) -> ZygoteProc | None:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        too_big = False
        try:
            socket.send_fds(self.ctl, [req], [out_w, err_w, theirs.fileno()])
            got = select.select([mine], [], [], REPLY_S)[0]
            reply = json.loads(mine.recv(MSG_MAX) or b"{}") if got else {}
        except (OSError, ValueError) as e:
            reply, too_big = {"error": str(e)}, getattr(e, "errno", None) == errno.EMSGSIZE
        finally:
            os.close(out_w)
            os.close(err_w)
            theirs.close()
        if "pid" not in reply:
            for fd in (out_r, err_r):
                os.close(fd)
            mine.close()
            if too_big:     # nothing was sent: the zygote serves the others on
                note(f"a request of {len(req)} bytes (argv and environment) is too large "
                     "for its socket; this rank starts as a new process")
                return None
            self.fail(reply.get("error") or self.last_words() or "no answer to a fork")
            return None
        return ZygoteProc(list(argv), int(reply["pid"]), mine, os.fdopen(out_r, "rb"),
                          os.fdopen(err_r, "rb"))

    def last_words(self) -> str:
        """The last line the zygote wrote on its stderr (why it exited)."""
        try:
            self.log.seek(0)
            lines = [ln for ln in self.log.read().decode(errors="replace").splitlines()
                     if ln.strip()]
        except (OSError, ValueError):
            return ""
        return lines[-1][-300:] if lines else ""

    def fail(self, why: str) -> None:
        if not self.broken:
            note(f"{why}; ranks start as new processes")
        self.broken = why or "failed"
        self.close()

    def close(self) -> None:
        """End the zygote: its remaining children are SIGKILLed and reaped first."""
        if self.ctl.fileno() < 0:
            return
        self.ctl.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


_PARKED: list[Zygote] = []      # the zygote warm() started, until a job takes it


def warm(also: tuple[str, ...] = ()) -> None:
    """Start this process's zygote now (call it before building the rig), so
    its imports (PRELOAD, then `also`) overlap whatever comes next; the next
    RigJob takes it."""
    if not enabled() or _PARKED:
        return
    try:
        _PARKED.append(Zygote(PRELOAD + tuple(also)))
    except OSError as e:
        note(f"cannot start ({e}); ranks start as new processes")
        return
    atexit.unregister(_close_parked)     # once
    atexit.register(_close_parked)


def take(new: bool = True, also: tuple[str, ...] = ()) -> Zygote | None:
    """The warmed zygote, else a new one importing PRELOAD and `also`
    (new=False: None); None with LTP_FORKSERVER=0. The caller closes it."""
    if not enabled():
        return None
    if _PARKED:
        return _PARKED.pop()
    if not new:
        return None
    try:
        return Zygote(PRELOAD + tuple(also))
    except OSError as e:
        note(f"cannot start ({e}); ranks start as new processes")
        return None


def _close_parked() -> None:
    while _PARKED:
        _PARKED.pop().close()
