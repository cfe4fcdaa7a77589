# SPDX-License-Identifier: Apache-2.0
"""The wheel holds the whole package and works once installed away from the source tree.

A wheel is built from a copy of the working tree (so the build's own build/
and egg-info land in the copy, not in the repository) with the project
venv's setuptools and no build isolation: an isolated build would fetch
setuptools from the package index, and this test must run offline.

It must hold every subpackage of the source tree (each folder under
dataplane/, control/ and tools/ with an __init__.py, and every module in
them), the BPF C sources (bpf/*.c, bpf/*.h), and neither ltpx/setup.py nor
any test.

Then a fresh venv (`/usr/bin/python3 -m venv --system-site-packages`) gets
the wheel with --no-deps, and `ltp -h`, `ltp train -h`, `ltp launch -h` and
`python -m ltpx.control.training -h` run from it, with the working directory
outside the repository, and `ltpx.__file__` must be inside that venv. So must
`ltpx.torch` (the public name of ltpx.control.torchapi, found through a
folder the package adds to its own __path__), while `torch` stays PyTorch.

Where the dependencies come from, honestly: the wheel's declared
dependencies (numpy, pyroute2, scapy, rich) are not in the system Python,
and installing them would need the package index. So, after the wheel is
installed, a .pth file lends the new venv the project venv's site-packages.
A .pth line only appends that folder to sys.path, after the new venv's own
site-packages, so the wheel's ltpx is the one imported (asserted), and the
.pth files inside the lent folder (among them the editable install's hook
that maps ltpx to the source tree) are not run. Torch is in the lent folder
too, so whether the help paths need it is checked on its own: after both
parsers have printed their help, torch must not be in sys.modules (torch is
the `train` extra; `--help` must work without it).

About 5 s, most of it the build; the temporary folder is removed at the end.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("dataplane", "control", "tools")
NOT_COPIED = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info",
                                    "__pycache__", ".pytest_cache", "*.pcap")

PROBE = """
import contextlib, io, json, os, sys
import ltpx
from ltpx.control.training.rank import build_parser
from ltpx.tools.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    for show in (lambda: main(["train", "-h"]), lambda: build_parser().parse_args(["-h"])):
        try:
            show()
        except SystemExit:
            pass
print(json.dumps({"file": ltpx.__file__, "torch": "torch" in sys.modules,
                  "bpf": sorted(os.listdir(ltpx.BPF_DIR))}))
"""


def _run(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)


def _clean_env() -> dict[str, str]:
    """The environment without anything that points Python at the source tree."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONNOUSERSITE="1")
    return env


@pytest.fixture(scope="module")
def tmp():
    with tempfile.TemporaryDirectory(prefix="ltpx-pkg-") as d:
        yield Path(d)


@pytest.fixture(scope="module")
def wheel(tmp) -> Path:
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=NOT_COPIED, symlinks=True)
    out = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                "-q", "-w", str(tmp / "dist"), str(src)], cwd=tmp, env=_clean_env())
    assert out.returncode == 0, out.stderr[-3000:]
    (whl,) = (tmp / "dist").glob("ltpx-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(tmp, wheel) -> Path:
    v = tmp / "venv"
    out = _run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", "--without-pip",
                str(v)])
    assert out.returncode == 0, out.stderr
    py = str(v / "bin" / "python")
    env = _clean_env()
    if _run([py, "-m", "pip", "--version"], env=env).returncode != 0:
        # no pip among the system's packages: the venv's own (slower)
        assert _run([py, "-m", "ensurepip", "-q"], env=env).returncode == 0
    out = _run([py, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], cwd=tmp, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    # Only now lend the dependencies (see the module docstring): pip above saw
    # no other ltpx, so it had nothing of the project venv's to replace.
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     env=env).stdout.strip())
    assert site.is_relative_to(v)
    (site / "zz-ltpx-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return v


def _package_dirs() -> list[Path]:
    return sorted(d for part in PARTS for d in [ROOT / part, *(ROOT / part).rglob("*")]
                  if d.is_dir() and (d / "__init__.py").exists())


@pytest.mark.slow
def test_wheel_holds_every_subpackage_and_the_bpf_sources_and_nothing_else(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {"ltpx/__init__.py", "ltpx/errors.py"}
    for d in _package_dirs():
        want |= {f"ltpx/{p.relative_to(ROOT)}" for p in d.glob("*.py")}
    want |= {f"ltpx/bpf/{p.name}" for ext in ("*.c", "*.h") for p in (ROOT / "bpf").glob(ext)}
    assert len(_package_dirs()) >= 7 and any(n.endswith(".c") for n in want)
    missing = sorted(want - names)
    assert not missing, f"not in the wheel: {missing}"
    assert "ltpx/setup.py" not in names
    tests = [n for n in names if "/tests/" in f"/{n}" or "conftest" in n or "/test_" in n]
    assert not tests, f"tests in the wheel: {tests}"
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "ltp = ltpx.tools.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


@pytest.mark.slow
def test_installed_wheel_answers_help_away_from_the_source_tree(venv, tmp):
    env, bin_ = _clean_env(), venv / "bin"
    outside = tmp / "elsewhere"
    outside.mkdir(exist_ok=True)
    for argv, word in (([str(bin_ / "ltp"), "-h"], "train"),
                       ([str(bin_ / "ltp"), "train", "-h"], "--downlink"),
                       ([str(bin_ / "ltp"), "launch", "-h"], "--keep"),
                       ([str(bin_ / "python"), "-m", "ltpx.control.training", "-h"], "--group")):
        out = _run(argv, cwd=outside, env=env)
        assert out.returncode == 0 and word in out.stdout, (argv, out.stderr[-2000:])
    bad = _run([str(bin_ / "ltp"), "train", "--no-such-flag"], cwd=outside, env=env)
    assert bad.returncode == 2 and "--no-such-flag" in bad.stderr
    probe = _run([str(bin_ / "python"), "-c", PROBE], cwd=outside, env=env)
    assert probe.returncode == 0, probe.stderr[-2000:]
    got = json.loads(probe.stdout)
    assert Path(got["file"]).resolve().is_relative_to(venv.resolve()), got["file"]
    assert not got["torch"], "a --help path imported torch"
    assert "ltp_xdp.c" in got["bpf"] and "ltp_wire.h" in got["bpf"]


TORCH_PROBE = """
import json, torch, ltpx.torch as lt
print(json.dumps({"lt": lt.__file__, "torch": torch.__file__,
                  "api": lt.DistributedOptimizer.__module__}))
"""


@pytest.mark.slow
def test_installed_wheel_has_ltpx_torch(venv, tmp):
    outside = tmp / "elsewhere"
    outside.mkdir(exist_ok=True)
    probe = _run([str(venv / "bin" / "python"), "-c", TORCH_PROBE], cwd=outside, env=_clean_env())
    assert probe.returncode == 0, probe.stderr[-2000:]
    got = json.loads(probe.stdout)
    assert Path(got["lt"]).resolve().is_relative_to(venv.resolve()), got["lt"]
    assert got["lt"].endswith("control/torchapi/alias/torch/__init__.py")
    assert got["torch"].endswith("site-packages/torch/__init__.py")
    assert not Path(got["torch"]).resolve().is_relative_to(venv.resolve())   # PyTorch, lent
    assert got["api"] == "ltpx.control.torchapi.optimizer"
