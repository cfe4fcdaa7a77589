# SPDX-License-Identifier: Apache-2.0
"""The README's quoted outputs are what the commands print now (issue 25,
item 9): each `$ sudo .venv/bin/ltp doctor|demo|bench xdp` block is run and its shape
compared: the same lines in the same order, each starting with the same
words (numbers, paths and versions differ from machine to machine)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import requires_bpf

ROOT = Path(__file__).resolve().parent.parent
LTP = str(Path(sys.executable).parent / "ltp")

pytestmark = [requires_bpf, pytest.mark.root]


def quoted(command: str) -> list[str]:
    """The lines the README shows after `$ sudo .venv/bin/ltp COMMAND`."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index(f"$ sudo .venv/bin/ltp {command}") + 1
    out = []
    for ln in lines[start:]:
        if not ln.strip() or ln.startswith(("$ ", "```")):
            break
        out.append(ln)
    return out


def shape(line: str) -> str:
    """A line's words up to its first number, path or value."""
    return re.split(r"[\d/\[{(]", line, maxsplit=1)[0].split(":")[0].strip()


@pytest.mark.parametrize("command", ["doctor", "demo", "bench xdp"])
def test_the_readme_shows_what_the_command_prints(command):
    want = quoted(command)
    assert want, f"README quotes no `ltp {command}`"
    p = subprocess.run([LTP, *command.split()], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    got = p.stdout.splitlines()
    assert [shape(x) for x in got] == [shape(x) for x in want], (got, want)
