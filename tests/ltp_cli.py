# SPDX-License-Identifier: Apache-2.0
"""What the tests of the operator commands (test_cli_ops.py: load, unload,
status; test_cli_flows.py: flows, top, capture) share: the real `ltp`
command as a subprocess, and a rig whose PS carries a program `ltp load`
loaded. Each test module builds its own rig (a module-scoped fixture)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import WHY_NOT_BPF

LTP = str(Path(sys.executable).parent / "ltp")
JOB = 0x17
NEL = 20_000                     # 57 chunks of 1424 bytes, the last 256 bytes
CHUNK = 1424
NCH = -(-NEL * 4 // CHUNK)
LAST = NEL * 4 - (NCH - 1) * CHUNK


def ltp(*args: str, rc: int | None = 0, timeout: float = 60, env=None
        ) -> subprocess.CompletedProcess:
    p = subprocess.run([LTP, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       env=env)
    if rc is not None:
        assert p.returncode == rc, (args, p.returncode, p.stdout, p.stderr)
    return p


def ltp_json(*args: str, rc: int = 0):
    return json.loads(ltp(*args, "-j", rc=rc).stdout)


def width(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def rig_fixtures(name: str):
    """The module-scoped fixtures `rig` and `loaded` of a test module (assign
    them to those names there): rig `name` (PS + 2 workers, loss injector
    toward the PS) and `ltp load` on its PS."""

    @pytest.fixture(scope="module")
    def rig():
        yield from _rig_with_cleanup(name)

    @pytest.fixture(scope="module")
    def loaded(rig):
        return load_ps(rig)
    return rig, loaded


def _rig_with_cleanup(name: str):
    """Rig `name`; on the way out, whatever `ltp load` left in its namespaces
    is unloaded, also on failure."""
    if WHY_NOT_BPF:
        pytest.skip(WHY_NOT_BPF)
    from ltpx.dataplane.rig.star import Rig, RigConfig
    from ltpx.dataplane.xdp import registry
    with Rig(RigConfig(name=name, workers=2, loss=0.0)) as r:
        try:
            yield r
        finally:
            for ns in r.namespaces:
                for n, dev in registry.entries(ns):
                    registry.unload(dev, n)


def load_ps(rig) -> dict:
    """`ltp load` on the PS (native, job 0x17, 2 workers, 20000-element rounds)."""
    return ltp_json("load", rig.ps.ifname, "--netns", rig.ps.netns, "--role", "ps",
                    "--workers", 2, "--max-elems", NEL, "--job", hex(JOB))


def ours(rig, rows: list[dict]) -> list[dict]:
    """The rows of a listing that are about `rig` (other runs may load programs too)."""
    return [r for r in rows if r["netns"] in rig.namespaces]
