# SPDX-License-Identifier: Apache-2.0
"""The fork server (control/launcher/forkserver.py, zygote.py): ranks forked from
a zygote run in their network namespace with their own environment, argv
and cwd, their exit codes and output come back as a Popen's would, the
zygote and its children end with whoever owns them, RigJob forks its ranks
and its store from it, and LTP_FORKSERVER=0 starts new interpreters.

Real processes, a real namespace (hhfs<pid>, with a veth pair in it) and
real sockets; most tests use a zygote that preloads nothing (it starts in a
tenth of a second), the RigJob test the real one (torch and ltpx.torch).
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from ltpx.control.launcher import forkserver

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)"),
              pytest.mark.rig]

NS = f"hhfs{os.getpid() % 100000}"
PY = sys.executable

REPORT = """\
import json, os, socket, sys
print(json.dumps({"name": __name__, "argv": sys.argv, "cwd": os.getcwd(),
                  "path0": sys.path[0], "x": os.environ.get("HH_X"),
                  "leak": os.environ.get("HH_ZYGOTE_ONLY"), "stdin": sys.stdin.read(),
                  "ifaces": sorted(n for _, n in socket.if_nameindex()),
                  "environ": open("/proc/self/environ", "rb").read().decode(),
                  "cmdline": open("/proc/self/cmdline", "rb").read().decode(),
                  "comm": open("/proc/self/comm").read().strip()}))
print("to stderr", file=sys.stderr)
"""


@pytest.fixture(scope="module")
def ns():
    from pyroute2 import IPRoute

    from ltpx.dataplane import netns
    netns.create(NS)
    try:
        with netns.inside(NS):
            ipr = IPRoute()
        with ipr:
            ipr.link("add", ifname="hhfa0", kind="veth", peer="hhfb0")
        yield NS
    finally:
        netns.remove(NS)


@pytest.fixture(scope="module")
def zygote():
    os.environ["HH_ZYGOTE_ONLY"] = "1"       # in the zygote's environment, not a child's
    try:
        z = forkserver.Zygote(preload=())
    finally:
        del os.environ["HH_ZYGOTE_ONLY"]
    assert z.ready(), z.last_words()
    yield z
    z.close()


def env(**extra) -> dict:
    e = {**os.environ, **forkserver.IMPORT_ENV, **extra}
    e.pop("HH_ZYGOTE_ONLY", None)
    return e


def run(z, argv, netns=None, cwd=None, **extra) -> tuple[int, str, str]:
    p = z.spawn(argv, env(**extra), netns=netns, cwd=cwd)
    assert isinstance(p, forkserver.ZygoteProc), z.broken
    out, err = p.stdout.read().decode(), p.stderr.read().decode()
    return p.wait(timeout=60), out, err


def gone(pid: int) -> bool:
    """Not running: no such process, or a zombie its new parent has yet to reap."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.rig
def test_a_script_runs_in_its_netns_with_its_env_argv_and_cwd(ns, zygote, tmp_path):
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    work = tmp_path / "work"
    work.mkdir()
    code, out, err = run(zygote, [PY, str(script), "--flag", "v"], netns=ns, cwd=str(work),
                         HH_X="rank-3")
    assert code == 0, err
    got = json.loads(out)
    assert got["name"] == "__main__"
    assert got["argv"] == [str(script), "--flag", "v"]
    assert got["cwd"] == str(work) and got["path0"] == str(tmp_path)
    assert got["x"] == "rank-3" and got["leak"] is None and got["stdin"] == ""
    host = {n for _, n in socket.if_nameindex()} - {"lo"}
    assert {"hhfa0", "hhfb0", "lo"} <= set(got["ifaces"])
    assert not host & set(got["ifaces"]), got["ifaces"]      # the netns', not the host's
    assert "HH_X=rank-3" in got["environ"].split("\0")       # what ps and /proc readers see
    assert got["cmdline"].split("\0")[:2] == [PY, str(script)]
    assert got["comm"] == os.path.basename(PY)[:15]          # its own name, not the server's
    assert err == "to stderr\n"


@pytest.mark.rig
def test_ranks_and_the_fork_server_have_names_of_their_own(zygote, tmp_path):
    """top, ps and `ltp bench soak` tell them apart: the fork server is
    ltp-forkserver, a rank ltp-rank<RANK>, the store host ltp-store."""
    with open(f"/proc/{zygote.pid}/comm") as f:
        assert f.read().strip() == "ltp-forkserver"
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    code, out, err = run(zygote, [PY, str(script)], RANK="3")
    assert code == 0, err
    assert json.loads(out)["comm"] == "ltp-rank3"
    from ltpx.control.launcher.zygote import comm_for
    assert comm_for([PY, "-m", "ltpx.control.launcher.storehost", "300"], {}) == "ltp-store"
    assert comm_for([PY, "job.py", "--out", "/tmp/storehost"], {}) == os.path.basename(PY)


@pytest.mark.rig
def test_a_module_runs_as_python_m_does(ns, zygote, tmp_path):
    (tmp_path / "hhmod.py").write_text(
        "import sys, json\nif __name__ == '__main__':\n"
        "    print(json.dumps({'argv': sys.argv, 'path0': sys.path[0]}))\n")
    code, out, err = run(zygote, [PY, "-m", "hhmod", "a", "b"], netns=ns, cwd=str(tmp_path))
    assert code == 0, err
    got = json.loads(out)
    assert got["argv"] == [str(tmp_path / "hhmod.py"), "a", "b"]
    assert got["path0"] == str(tmp_path)
    code, _, err = run(zygote, [PY, "-m", "hhmod_missing"], cwd=str(tmp_path))
    assert code == 1 and "No module named hhmod_missing" in err


@pytest.mark.rig
@pytest.mark.parametrize("body,code,says", [
    ("print('ok')", 0, ""),
    ("import sys\nsys.exit(3)", 3, ""),
    ("raise ValueError('boom')", 1, "ValueError: boom"),
    ("raise SystemExit('bad input')", 1, "bad input"),
    ("raise KeyboardInterrupt", -signal.SIGINT, "KeyboardInterrupt"),
    ("import atexit\natexit.register(print, 'at exit')\nimport sys\nsys.exit(4)", 4, ""),
])
def test_exit_codes_come_back(zygote, tmp_path, body, code, says):
    script = tmp_path / "job.py"
    script.write_text(body + "\n")
    got, out, err = run(zygote, [PY, str(script)])
    assert got == code, err
    assert says in err
    if "atexit" in body:
        assert out == "at exit\n"
    if "ValueError" in body:
        assert "Traceback (most recent call last)" in err


@pytest.mark.rig
def test_a_thread_pool_left_open_does_not_keep_the_rank_alive(zygote, tmp_path):
    """A job that ends with a ThreadPoolExecutor still open and referenced
    (its idle threads are not daemons) exits as `python job.py` does: the pool's own exit call
    stops its threads before they are joined (ltpx's answer hashing keeps
    such a pool; ltp launch hung at the end of every big_model rank)."""
    script = tmp_path / "pool.py"
    script.write_text("from concurrent.futures import ThreadPoolExecutor\n"
                      "import builtins\n"
                      "pool = builtins.kept = ThreadPoolExecutor(2)   # alive to the end\n"
                      "print(sum(pool.map(abs, [-1, 2, -3])), flush=True)\n")
    p = zygote.spawn([PY, str(script)], env())
    try:
        code = p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("the rank did not exit: its pool's idle threads were joined "
                    "before the pool was told to stop")
    assert code == 0 and p.stdout.read() == b"6\n"


@pytest.mark.rig
@pytest.mark.parametrize("how,code", [("kill", -signal.SIGKILL),
                                      ("terminate", -signal.SIGTERM)])
def test_signals_reach_the_child(zygote, tmp_path, how, code):
    script = tmp_path / "sleep.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    p = zygote.spawn([PY, str(script)], env())
    assert p.stdout.readline() == b"up\n"
    assert p.poll() is None
    getattr(p, how)()
    assert p.wait(timeout=10) == code and p.poll() == code
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.spawn([PY, str(script)], env()).wait(timeout=0.2)


@pytest.mark.rig
def test_many_lines_arrive_on_both_pipes(zygote, tmp_path):
    script = tmp_path / "lines.py"
    script.write_text("import sys\nfor i in range(5000):\n    print('out', i)\n"
                      "    print('err', i, file=sys.stderr)\n")
    p = zygote.spawn([PY, str(script)], env())
    sel, got = selectors.DefaultSelector(), {"out": b"", "err": b""}
    sel.register(p.stdout, selectors.EVENT_READ, "out")
    sel.register(p.stderr, selectors.EVENT_READ, "err")
    while sel.get_map():
        for key, _ in sel.select(10):
            data = os.read(key.fileobj.fileno(), 65536)
            if data:
                got[key.data] += data
            else:
                sel.unregister(key.fileobj)
    assert p.wait(timeout=10) == 0
    assert got["out"].decode().splitlines() == [f"out {i}" for i in range(5000)]
    assert got["err"].decode().splitlines() == [f"err {i}" for i in range(5000)]


@pytest.mark.rig
def test_a_missing_netns_fails_the_rank_with_a_clear_error(zygote, tmp_path):
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    code, out, err = run(zygote, [PY, str(script)], netns="hhnope0")
    assert code == 1 and out == ""
    assert "network namespace 'hhnope0' cannot be entered" in err


@pytest.mark.rig
def test_what_cannot_be_forked_is_refused(zygote, tmp_path):
    assert forkserver.plan([PY, "-c", "1"]) is None
    assert forkserver.plan([PY, "-u", "x.py"]) is None
    assert forkserver.plan(["/bin/echo", "x.py"]) is None
    assert forkserver.plan([PY, "x.py", "-u"]) == ("script", "x.py", ["-u"])
    assert zygote.spawn([PY, "-c", "1"], env()) is None
    # read while importing: the zygote's value would be wrong for this rank
    assert zygote.spawn([PY, str(tmp_path / "x.py")], env(OMP_NUM_THREADS="2")) is None
    assert zygote.ready() and not zygote.broken          # and it still serves the others


@pytest.mark.rig
@pytest.mark.parametrize("body,says", [
    ("import sys\nprint('hhbad: cannot', file=sys.stderr)\nsys.exit(5)", "hhbad: cannot"),
    ("import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True)"
     ".start()", "2 threads after the imports"),
])
def test_a_failing_zygote_falls_back_with_one_note(tmp_path, monkeypatch, capfd, body, says):
    (tmp_path / "hhbad.py").write_text(body + "\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    z = forkserver.Zygote(preload=("hhbad",))
    assert z.spawn([PY, str(tmp_path / "x.py")], z.env) is None
    assert z.spawn([PY, str(tmp_path / "x.py")], z.env) is None
    assert z.broken and says in z.broken
    assert z.proc.poll() is not None
    notes = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("note: fork")]
    assert len(notes) == 1 and says in notes[0] and "new processes" in notes[0]


@pytest.mark.rig
def test_close_ends_the_zygote_and_its_children(tmp_path):
    z = forkserver.Zygote(preload=())
    script = tmp_path / "sleep.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    p = z.spawn([PY, str(script)], env())
    assert p.stdout.readline() == b"up\n"
    z.close()
    assert z.proc.poll() is not None
    assert p.wait(timeout=5) == -signal.SIGKILL
    assert not os.path.exists(f"/proc/{p.pid}")             # reaped by the zygote itself
    assert z.spawn([PY, str(script)], env()) is None          # closed: new interpreters


@pytest.mark.rig
def test_nothing_outlives_a_sigkilled_launcher(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(60)\n")
    launcher = subprocess.Popen([PY, "-c", f"""
import json, os, sys, time
from ltpx.control.launcher import forkserver
z = forkserver.Zygote(preload=())
p = z.spawn([sys.executable, {str(script)!r}], z.env)
print(json.dumps([z.pid, p.pid]), flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(launcher.stdout.readline())
        assert not any(gone(pid) for pid in pids)
    finally:
        launcher.kill()
        launcher.wait()
    end = time.monotonic() + 10
    while not all(gone(pid) for pid in pids) and time.monotonic() < end:
        time.sleep(0.05)
    assert all(gone(pid) for pid in pids)                    # PR_SET_PDEATHSIG, both levels


RANK_JOB = """\
import json, os, socket, sys
from datetime import timedelta
import numpy as np, torch, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), None, False,
                      timedelta(seconds=30))
print(json.dumps({"rank": int(os.environ["RANK"]), "n": store.add("n", 1),
                  "ifaces": [n for _, n in socket.if_nameindex()],
                  "torch": torch.rand(3).tolist(), "numpy": float(np.random.random()),
                  "threads": torch.get_num_threads()}))
"""


@pytest.mark.rig
@pytest.mark.parametrize("switch", ["1", "0"])
def test_rigjob_forks_ranks_and_store_and_falls_back(ns, tmp_path, monkeypatch, switch):
    from ltpx.control.launcher.launch import Rank, RigJob
    monkeypatch.setenv(forkserver.ENV_SWITCH, switch)
    script = tmp_path / "rank.py"
    script.write_text(RANK_JOB)
    host = SimpleNamespace(netns=ns, name="h")
    ranks = [Rank(i, "worker", i, host) for i in range(3)]
    forkserver.warm()
    job = RigJob(SimpleNamespace(ps=host, name="hh"), ranks, store_timeout_s=60)
    lines: dict[int, list[str]] = {}
    try:
        assert (job.store_proc is not None) == (switch == "1")   # the store forked too
        job.start(lambda r: [PY, str(script)],
                  lambda r: dict(os.environ, **forkserver.IMPORT_ENV, RANK=str(r.rank),
                                 MASTER_PORT=str(job.port)))
        end = time.monotonic() + 120
        while job.running() and time.monotonic() < end:
            job.pump(lambda r, stream, line: lines.setdefault(r.rank, []).append(line))
    finally:
        job.close()
    assert [r.code for r in ranks] == [0, 0, 0], lines
    assert [r.forked for r in ranks] == [switch == "1"] * 3
    got = [json.loads(lines[r.rank][-1]) for r in ranks]
    assert sorted(g["n"] for g in got) == [1, 2, 3]
    assert all("hhfa0" in g["ifaces"] and g["threads"] == 1 for g in got)
    # unseeded generators differ per process, as new interpreters' do
    assert len({g["numpy"] for g in got}) == 3 and len({str(g["torch"]) for g in got}) == 3
    if switch == "1":
        assert job.zygote.proc.poll() is not None and job.store_proc.poll() is not None


@pytest.mark.rig
def test_an_exit_crossing_a_signal_keeps_its_code_and_the_zygote(tmp_path):
    """One select brings a child's exit and then its owner's SIGTERM order for
    it (the zygote is stopped while both happen): the exit code comes back,
    not -9, and the zygote serves the next fork; then the same race left to
    the scheduler, many times: 3, or -15 when the signal won."""
    z = forkserver.Zygote(preload=())
    assert z.ready(), z.last_words()
    flag = tmp_path / "go"
    script = tmp_path / "exit3.py"
    script.write_text(f"import os, sys, time\nprint('up', flush=True)\n"
                      f"while not os.path.exists({str(flag)!r}):\n    time.sleep(0.001)\n"
                      "sys.exit(3)\n")
    try:
        for _ in range(5):
            flag.unlink(missing_ok=True)
            p = z.spawn([PY, str(script)], env())
            assert p.stdout.readline() == b"up\n"
            os.kill(z.pid, signal.SIGSTOP)
            try:
                flag.touch()
                end = time.monotonic() + 10
                while not gone(p.pid) and time.monotonic() < end:
                    time.sleep(0.005)
                assert gone(p.pid)          # exited, not yet reaped by the stopped zygote
                p.terminate()
            finally:
                os.kill(z.pid, signal.SIGCONT)
            assert p.wait(timeout=10) == 3
            p.stdout.close()
            p.stderr.close()
        codes = []
        for i in range(30):
            flag.unlink(missing_ok=True)
            p = z.spawn([PY, str(script)], env())
            assert p.stdout.readline() == b"up\n"
            flag.touch()
            time.sleep(i % 6 * 0.0005)
            p.terminate()
            codes.append(p.wait(timeout=10))
            p.stdout.close()
            p.stderr.close()
        assert set(codes) <= {3, -signal.SIGTERM}, codes
        assert z.proc.poll() is None and not z.broken
        (tmp_path / "ok.py").write_text("print('next')\n")
        assert run(z, [PY, str(tmp_path / "ok.py")])[:2] == (0, "next\n")
    finally:
        z.close()


@pytest.mark.rig
def test_a_status_reset_behind_an_exit_message_keeps_the_code():
    """The zygote's end closed with our signal order unread: the kernel resets
    our end (ECONNRESET) in front of the exit message, which still comes."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    p = forkserver.ZygoteProc(["x"], 1, mine, None, None)
    p.terminate()                           # unread when the zygote's end closes
    theirs.send(json.dumps({"exit": 3}).encode())
    theirs.close()
    assert p.wait(timeout=5) == 3


@pytest.mark.rig
def test_an_oversized_request_falls_back_for_that_rank_only(zygote, tmp_path, capfd):
    script = tmp_path / "ok.py"
    script.write_text("print('ok')\n")
    assert zygote.spawn([PY, str(script)], env(HH_BIG="x" * (1 << 20))) is None
    notes = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("note: fork")]
    assert len(notes) == 1 and "too large" in notes[0] and "this rank" in notes[0]
    assert not zygote.broken and zygote.proc.poll() is None
    assert run(zygote, [PY, str(script)])[:2] == (0, "ok\n")


def zygotes_of_mine() -> list[int]:
    """This process's zygote children (running or unreaped)."""
    found = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and forkserver.ZYGOTE_MODULE.encode() in cmd:
            found.append(int(d))
    return found


@pytest.mark.rig
def test_a_rigjob_that_cannot_host_its_store_ends_its_zygote(tmp_path):
    """The store's namespace is missing: the forked store fails, the in-process
    fallback raises, and the zygote RigJob took is gone with the error (so is
    train_on_rig's empty log directory)."""
    from ltpx.control.training.config import TrainConfig
    from ltpx.control.launcher.launch import Rank, RigJob
    from ltpx.control.training.onrig import train_on_rig
    host = SimpleNamespace(netns="hhnope1", name="h")
    parked = forkserver.take(new=False)        # (one an earlier test left parked)
    if parked is not None:
        parked.close()
    others = set(zygotes_of_mine())             # (the module's fixture)
    forkserver.warm()
    assert set(zygotes_of_mine()) - others
    with pytest.raises(FileNotFoundError, match="hhnope1"):
        RigJob(SimpleNamespace(ps=host, name="hh"), [Rank(0, "worker", 0, host)],
               store_timeout_s=5)
    assert set(zygotes_of_mine()) == others
    rig = SimpleNamespace(name=f"hhgone{os.getpid()}", ps=host, workers=[host])
    logs = f"ltp-train-{rig.name}-"
    with pytest.raises(FileNotFoundError, match="hhnope1"):
        train_on_rig(rig, TrainConfig(), workers=1)
    assert set(zygotes_of_mine()) == others
    import tempfile
    assert not [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(logs)]
