# SPDX-License-Identifier: Apache-2.0
"""The fork server's process: import once, then fork one child per rank (see forkserver.py).

`python -m ltpx.control.launcher.zygote FD OWNER MODULES`: FD is its end of
the launcher's control socket (SOCK_SEQPACKET), OWNER the launcher's pid,
MODULES what to import (comma-separated). It dies with its owner
(PR_SET_PDEATHSIG), imports, checks that no thread was started, says
{"ready": ...} and then serves: each request (JSON + the child's stdout
and stderr write ends and a status socket, by SCM_RIGHTS) is one fork.

The child leaves the zygote's loop before it runs anything (serve() returns
it the job, main() runs it at the top), enters the request's network
namespace (setns, as dataplane/netns.py does), takes the pipes as fds 1 and
2 (stdin /dev/null), the environment (os.environ replaced), cwd, sys.argv,
sys.path[0] and the signal dispositions a new interpreter would have,
reseeds numpy's and torch's global generators from the OS's entropy, as a
new interpreter has them (Python's `random` reseeds itself at fork; a
job's own seeds come later and win), and runs the
module or script with runpy as __main__. It then exits as `python -m mod`
or `python script.py` would (finish(): SystemExit's code, 1 and a
traceback for an exception, non-daemon threads joined and atexit handlers
run at the end), but through os._exit: nothing of the zygote runs in it.
"""
from __future__ import annotations

import atexit
import gc
import io
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

from ...dataplane.clib import set_comm, set_parent_death_signal, set_proc_strings, setns
from ..settings_table import TABLE
from .forkserver import MSG_MAX, STORE_MODULE
import importlib.util

NETNS_DIR = "/run/netns"


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def preload(modules: list[str]) -> list[str]:
    """Import each; the names that failed (a rank that needs one fails on its own)."""
    failed = []
    for name in modules:
        try:
            __import__(name)
        except Exception:    # noqa: BLE001 - not this machine's module: the rank will say
            failed.append(name)
    return failed


def send(sock: socket.socket, msg: dict) -> None:
    try:
        sock.send(json.dumps(msg).encode())
    except OSError:
        pass


def drain(sock: socket.socket) -> None:
    """Read and drop what waits on sock (a child's owner's late signal orders)."""
    while True:
        try:
            if not sock.recv(4096, socket.MSG_DONTWAIT):
                return
        except OSError:
            return


@dataclass
class Job:
    """One rank, in the forked child."""

    req: dict
    out: int
    err: int
    signals: dict

    def run(self) -> None:
        self.setup()
        how, target, args = self.req["how"], self.req["target"], self.req["args"]
        if how == "module":
            sys.path[0] = os.getcwd()      # as `python -m` has it
            try:
                found = importlib.util.find_spec(target) is not None
            except ImportError:
                found = False
            if not found:
                sys.stderr.write(f"{sys.executable}: No module named {target}\n")
                raise SystemExit(1)
            sys.argv = [target, *args]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            if not os.path.exists(target):
                sys.stderr.write(f"{sys.executable}: can't open file "
                                 f"{os.path.abspath(target)!r}: [Errno 2] No such file or "
                                 "directory\n")
                raise SystemExit(2)
            sys.path[0] = os.path.dirname(os.path.realpath(target))
            sys.argv = [target, *args]
            runpy.run_path(target, run_name="__main__")

    def setup(self) -> None:
        env = self.req["env"]
        os.dup2(self.out, 1)
        os.dup2(self.err, 2)
        os.close(self.out)
        os.close(self.err)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        stdio(bool(env.get("PYTHONUNBUFFERED")))
        for sig, handler in self.signals.items():
            try:
                signal.signal(sig, handler)
            except (OSError, ValueError, TypeError):
                pass
        os.environ.clear()
        os.environ.update(env)
        set_proc_strings(self.req["argv"], env)     # for ps and /proc/PID/environ readers
        set_comm(comm_for(self.req["argv"], env))   # not the fork server's name
        name = self.req.get("netns")
        if name:
            path = os.path.join(NETNS_DIR, name)
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as e:
                raise SystemExit(f"network namespace {name!r} cannot be entered ({path}: "
                                 f"{e.strerror}): this rank does not start") from None
            try:
                setns(fd)
            finally:
                os.close(fd)
        os.chdir(self.req["cwd"])
        rng = sys.modules.get("numpy.random")
        if rng is not None:
            rng.seed()      # from the OS's entropy, as a new interpreter's
        if "torch" in sys.modules:
            sys.modules["torch"].seed()     # likewise (torch 2.13 seeds each process anew)


def stdio(unbuffered: bool) -> None:
    """New sys.stdin/stdout/stderr on fds 0-2, buffered as a new interpreter's
    on pipes (PYTHONUNBUFFERED: unbuffered, write-through)."""
    enc = sys.stdout.encoding if sys.stdout else "utf-8"
    errors = sys.stdout.errors if sys.stdout else "strict"
    for f in (sys.stdout, sys.stderr):
        if f:
            try:
                f.flush()
            except (OSError, ValueError):
                pass

    def writer(fd: int, errs: str, line: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w", closefd=False)
        return io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), encoding=enc,
                                errors=errs, line_buffering=line and not unbuffered,
                                write_through=unbuffered)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=enc, errors=errors)
    sys.stdout = sys.__stdout__ = writer(1, errors, False)
    sys.stderr = sys.__stderr__ = writer(2, "backslashreplace", True)


class Server:
    """The zygote's loop: requests on the control socket, children's exits
    (pidfds) and their owners' orders (status sockets)."""

    def __init__(self, ctl: socket.socket, signals: dict):
        self.ctl, self.signals, self.pid = ctl, signals, os.getpid()
        self.sel = selectors.DefaultSelector()
        self.sel.register(ctl, selectors.EVENT_READ, None)
        self.kids: dict[int, tuple[socket.socket, int]] = {}    # pid -> status, pidfd

    def serve(self) -> Job | None:
        """Serve until the launcher closes the control socket (None); in a
        forked child, return its job."""
        while True:
            for key, _ in self.sel.select():
                if key.data is None:
                    job = self.request()
                    if job is not None or self.ctl.fileno() < 0:
                        return job
                elif not self.current(key):
                    continue    # its child was reaped earlier in this batch
                elif key.data[0] == "exit":
                    self.reap(key.data[1])
                else:
                    self.order(key.data[1])

    def current(self, key: selectors.SelectorKey) -> bool:
        """Whether an event is still about a child of ours (one select can bring
        a child's exit and then its owner's signal for it: reap() went first)."""
        kid = self.kids.get(key.data[1])
        if kid is None:
            return False
        return key.fileobj is kid[0] if key.data[0] == "order" else key.fileobj == kid[1]

    def request(self) -> Job | None:
        try:
            msg, fds, _, _ = socket.recv_fds(self.ctl, MSG_MAX, 3)
        except OSError:
            msg, fds = b"", []
        if not msg or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            if not msg:
                self.shutdown()
            return None
        out, err, status = fds
        reply = socket.socket(fileno=status)
        try:
            req = json.loads(msg)
            if threads() != 1:
                raise OSError("a thread runs in the zygote: it cannot fork safely")
            pid = os.fork()
        except (ValueError, OSError) as e:
            send(reply, {"error": f"fork: {e}"})
            reply.close()
            os.close(out)
            os.close(err)
            return None
        if pid == 0:
            self.leave(reply)
            return Job(req, out, err, self.signals)
        os.close(out)
        os.close(err)
        pidfd = os.pidfd_open(pid)
        self.kids[pid] = (reply, pidfd)
        self.sel.register(pidfd, selectors.EVENT_READ, ("exit", pid))
        self.sel.register(reply, selectors.EVENT_READ, ("order", pid))
        send(reply, {"pid": pid})
        return None

    def leave(self, mine: socket.socket) -> None:
        """In the child: die with the zygote, drop every fd of the zygote's."""
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != self.pid:      # the zygote died before the line above
            os._exit(1)
        mine.close()
        for status, pidfd in self.kids.values():
            status.close()
            os.close(pidfd)
        self.kids.clear()
        self.sel.close()
        self.ctl.close()

    def reap(self, pid: int) -> None:
        status, pidfd = self.kids.pop(pid)
        self.sel.unregister(pidfd)
        os.close(pidfd)
        _, st = os.waitpid(pid, 0)
        drain(status)   # closing it with an unread order would reset the owner's end
        send(status, {"exit": os.waitstatus_to_exitcode(st)})
        if status.fileno() >= 0:
            if status in self.sel.get_map():
                self.sel.unregister(status)
            status.close()

    def order(self, pid: int) -> None:
        """A signal for a child, from its owner; its owner gone: SIGKILL (not yet
        reaped, so the pid is still this child's)."""
        status, _ = self.kids[pid]
        try:
            data = status.recv(4096)
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(status)
            os.kill(pid, signal.SIGKILL)
            return
        try:
            os.kill(pid, int(json.loads(data)["signal"]))
        except (ValueError, KeyError, TypeError, OSError):
            pass

    def shutdown(self) -> None:
        """The launcher is done: no child outlives it, none is left a zombie."""
        for pid in self.kids:
            os.kill(pid, signal.SIGKILL)
        for pid in list(self.kids):
            self.reap(pid)
        self.sel.close()
        self.ctl.close()


def comm_for(argv: list[str], env: dict) -> str:
    """A forked child's process name: ltp-rank<R> for a rank (LTP_RANK, else RANK),
    ltp-store for the job's store host (python -m ...storehost), else the
    program's own base name."""
    rank = str(env.get(TABLE["rank"].env) or env.get("RANK", ""))
    if rank.isdigit():
        return f"ltp-rank{rank}"
    if argv[1:3] == ["-m", STORE_MODULE]:
        return "ltp-store"
    return os.path.basename(argv[0]) if argv else "python3"


def main() -> None:
    fd, owner, modules = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    # dispositions as this new interpreter has them: each child gets them back
    signals = {s: signal.getsignal(s) for s in signal.valid_signals()
               if s not in (signal.SIGKILL, signal.SIGSTOP) and signal.getsignal(s) is not None}
    set_parent_death_signal(signal.SIGKILL)
    set_comm("ltp-forkserver")    # top, ps and `ltp bench soak` tell it from the ranks
    if os.getppid() != owner:     # the launcher died before the line above
        raise SystemExit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the launcher stops the ranks
    ctl = socket.socket(fileno=int(fd))
    t0 = time.process_time()
    failed = preload([m for m in modules.split(",") if m])
    if threads() != 1:
        send(ctl, {"error": f"{threads()} threads after the imports: cannot fork safely"})
        raise SystemExit(1)
    gc.freeze()          # the imported objects stay put: fewer pages copied per child
    send(ctl, {"ready": True, "pid": os.getpid(), "import_cpu_s": time.process_time() - t0,
               "not_imported": failed})
    job = Server(ctl, signals).serve()
    if job is not None:
        finish(job)


def script_frames(tb):
    """A traceback from the script's own first frame on: this module's and
    runpy's frames (how the zygote ran it) left out, as `python script.py`
    shows none of its own."""
    first = tb
    while tb is not None and (tb.tb_frame.f_code.co_filename == __file__ or
                              "runpy" in tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb or first


def finish(job: Job) -> None:
    """Run the child's job and end the process as `python script.py` would,
    without the interpreter's teardown of every module the zygote imported
    (0.3-1 s of CPU with torch loaded): SystemExit's code (None 0, a message
    1), an exception's traceback and 1, KeyboardInterrupt by SIGINT; then
    threading's exit calls and non-daemon threads joined, atexit handlers,
    stdio flushed, os._exit."""
    code, by_sigint = 0, False
    try:
        job.run()
    except SystemExit as e:
        code = exit_status(e.code)
    except BaseException as e:     # noqa: BLE001 - as the interpreter reports it
        e = e.with_traceback(script_frames(e.__traceback__))   # torch's hook reads e's own
        sys.excepthook(type(e), e, e.__traceback__)
        code, by_sigint = 1, isinstance(e, KeyboardInterrupt)
    join_threads()
    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if by_sigint:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def join_threads() -> None:
    """What the interpreter does first at its end: threading's own exit
    calls (a concurrent.futures pool's, which tell its idle threads to stop),
    then every non-daemon thread joined. Joining without those calls waits
    for ever on any ThreadPoolExecutor the job left open."""
    threading._shutdown()    # what Py_FinalizeEx calls, both steps in that order


def exit_status(code) -> int:
    """A SystemExit's code as the interpreter turns it into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except (OSError, ValueError):
        pass
    return 1


if __name__ == "__main__":
    main()
