# SPDX-License-Identifier: Apache-2.0
"""The licence of the BPF programs (bpf/): every file says it in an SPDX line,
every program carries the matching license string, and the kernel takes
that string as GPL-compatible; and the loader's view of the program's
files (bpfcache.sources and program_text) covers every header.
"""
from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from conftest import requires_bpf

ROOT = Path(__file__).resolve().parent.parent
BPF = ROOT / "bpf"
SOURCES = sorted([*BPF.glob("*.c"), *BPF.glob("*.h")])
PROGRAMS = sorted(BPF.glob("*.c"))
SPDX = "// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause"
#: the license string of a program dual-licensed as the SPDX line says
LICENSE = "Dual BSD/GPL"
#: what the kernel takes as GPL-compatible (include/linux/license.h)
KERNEL_GPL_COMPATIBLE = ("GPL", "GPL v2", "GPL and additional rights", "Dual BSD/GPL",
                         "Dual MIT/GPL", "Dual MPL/GPL")
_DEFINE = re.compile(r"^#define\s+BPF_LICENSE\s+(.+?)\s*$", re.M)


@pytest.mark.unit
@pytest.mark.parametrize("name", [p.name for p in SOURCES])
def test_every_bpf_file_opens_with_its_spdx_line(name):
    assert (BPF / name).read_text().splitlines()[0] == SPDX


@pytest.mark.unit
@pytest.mark.parametrize("name", [p.name for p in PROGRAMS])
def test_every_program_sets_the_dual_license_string_before_its_includes(name):
    """bcc's footer writes BPF_LICENSE into the license section, "GPL" when
    the source leaves it undefined (and cflags may not define it)."""
    text = (BPF / name).read_text()
    got = _DEFINE.findall(text)
    assert got == [LICENSE], f"{name}: BPF_LICENSE {got}"
    assert LICENSE in KERNEL_GPL_COMPATIBLE
    assert _DEFINE.search(text).start() < text.index("#include")


@pytest.mark.unit
def test_headers_leave_the_license_to_the_programs():
    assert not [p.name for p in BPF.glob("*.h") if _DEFINE.search(p.read_text())]


@pytest.mark.unit
def test_the_program_text_holds_every_header_once_and_the_key_covers_them():
    """What bcc is given for ltp_xdp.c: the source with each of the
    program's headers written in once, nothing of ours left to #include;
    and the compile cache's key reads the same files."""
    from ltpx.dataplane.xdp import bpfcache
    flags = [f"-I{BPF}"]
    text = bpfcache.program_text(BPF / "ltp_xdp.c", flags).decode()
    ours = {p.name for p in BPF.glob("*.h")}
    assert not [line for line in text.splitlines()
                if re.match(r'\s*#\s*include\s*"', line)]
    for name in ours:
        assert text.count(f'#line 1 "{BPF / name}"') == 1, name
    assert {p.name for p in bpfcache.sources(BPF / "ltp_xdp.c", flags)} == ours | {"ltp_xdp.c"}


@pytest.mark.root
@requires_bpf
@pytest.mark.parametrize("source,func,kind", [("ltp_xdp.c", "ltp_xdp", "XDP"),
                                              ("ltp_floor.c", "ltp_xdp", "XDP"),
                                              ("xdp_pass.c", "xdp_pass", "XDP"),
                                              ("loss_tc.c", "loss_tc", "SCHED_CLS"),
                                              ("path_pin.c", "link_count", "SCHED_CLS")])
def test_compiled_programs_carry_the_license_and_the_kernel_takes_it_as_gpl(
        source, func, kind, tmp_path, monkeypatch):
    """Compiled (through the cache, as every caller does) and loaded: the
    license the program was loaded with, and the kernel's gpl_compatible
    bit of it (struct bpf_prog_info, offset 84, bit 0)."""
    from ltpx.dataplane import clib
    from ltpx.dataplane.xdp.loader import compile_program
    from ltpx.dataplane.xdp.maps import Geometry
    monkeypatch.setenv("LTP_CACHE_DIR", str(tmp_path / "cache"))
    geometry = Geometry(slots=2, max_chunks=64)
    flags = geometry.cflags() if source in ("ltp_xdp.c", "ltp_floor.c") else None
    b, fn = compile_program(source, func, flags, prog_type=kind)
    try:
        assert b.art.license == LICENSE
        (word,) = struct.unpack_from("<I", clib.obj_info(fn.fd), 84)
        assert word & 1, f"{source}: the kernel does not take {LICENSE!r} as GPL-compatible"
    finally:
        b.cleanup()
