# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures. Privileged tests skip with a reason when the machine
cannot run them; on the project's machines and in CI they run."""
from __future__ import annotations

import os
import subprocess

import pytest

pytest_plugins = ["costmarks"]     # every test carries unit, root or rig


def _why_not_bpf() -> str | None:
    if os.geteuid() != 0:
        return "needs root (BPF and network namespaces): run the suite with sudo"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "needs bcc (Debian python3-bpfcc) in a --system-site-packages venv"
    if not os.path.exists(f"/lib/modules/{os.uname().release}/build"):
        return "needs kernel headers: run `ltp doctor --fix`"
    return None


WHY_NOT_BPF = _why_not_bpf()
requires_bpf = pytest.mark.skipif(WHY_NOT_BPF is not None, reason=WHY_NOT_BPF or "")


def reap_rig_owner(proc, rig_cls, name: str) -> None:
    """After a test whose child process owns rig `name`: kill the child if
    it still runs, and remove whatever of the rig is left."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if rig_cls.exists(name):
        rig_cls.destroy(name)


def sigint_default() -> None:
    """A child's preexec_fn: SIGINT as a terminal's Ctrl-C gives it. A shell
    running pytest in the background (`cmd &`, no job control) leaves SIGINT
    ignored in every child, and Python then raises no KeyboardInterrupt: a
    test of what Ctrl-C does must not depend on how pytest was started."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def reap(procs) -> None:
    """Kill and wait for each of `procs` still running (a test's finally)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def outputs(procs, timeout: float) -> list[tuple[str, str]]:
    """(stdout, stderr) of each process of a job once all ended; any still
    running when the time is up (or on an error) is killed and reaped."""
    try:
        return [p.communicate(timeout=timeout) for p in procs]
    finally:
        reap(procs)


def run_stopping(argv: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """subprocess.run, but a child still running at `timeout` gets SIGTERM
    first (`ltp launch` then stops its ranks and removes the rig it built)
    and SIGKILL only 30 s later; subprocess.TimeoutExpired as run's."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.terminate()
        try:
            p.communicate(timeout=30)
        finally:
            reap([p])
        raise
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def finish_all(procs, timeout: float) -> list[tuple[str, str]]:
    """(stdout, stderr) of each process of a job, once all exited 0."""
    outs = outputs(procs, timeout)
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    return outs


@pytest.fixture(scope="session")
def small_geometry():
    """Geometry for packet tests: 4 slots, 64 chunks of 1424 bytes, 2 banks."""
    from ltpx.dataplane.xdp.loader import Geometry
    return Geometry(slots=4, max_chunks=64)


def star_rig(clear: bool = False, **config):
    """For a module's `rig` fixture (`yield from star_rig(name=..., workers=...)`):
    a star rig with these RigConfig fields, removed when the module is done;
    the module's tests skip with the reason where BPF cannot run. `clear`:
    whatever `ltp load` or an endpoint left in its namespaces is unloaded
    first, also when a test failed."""
    if WHY_NOT_BPF:
        pytest.skip(WHY_NOT_BPF)
    from ltpx.dataplane.rig.star import Rig, RigConfig
    from ltpx.dataplane.xdp import registry
    with Rig(RigConfig(**config)) as r:
        try:
            yield r
        finally:
            for ns in r.namespaces if clear else ():
                registry.clear_namespace(ns)
