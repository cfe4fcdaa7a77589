# SPDX-License-Identifier: Apache-2.0
"""The BPF compile cache (dataplane/xdp/bpfcache.py): a program compiled once
and loaded from the cache by every later process, with real programs run
through BPF_PROG_TEST_RUN. Each test has its own cache folder (LTP_CACHE_DIR)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP, Ether
from scapy.packet import Raw

from conftest import reap, requires_bpf

pytestmark = requires_bpf

JOB, CHUNK = 7, 1424
XDP_PROG = 6


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("LTP_CACHE_DIR", str(d))
    return d


def counts() -> dict[str, int]:
    from ltpx.dataplane.xdp.bpfcache import SESSION
    return {k: v for k, v in SESSION.items() if isinstance(v, int)}


def delta(before: dict[str, int]) -> dict[str, int]:
    return {k: v - before[k] for k, v in counts().items() if v != before[k]}


def data_packet(chunk: int = 1) -> bytes:
    from ltpx.dataplane.xdp import wire as W
    body = np.arange(CHUNK // 4, dtype=np.float32).tobytes()
    return bytes(Ether(src="02:00:00:00:00:0a", dst="02:00:00:00:00:01") /
                 IP(src="198.18.0.10", dst="198.18.0.1") / UDP(sport=40000, dport=W.PORT) /
                 W.LTP(worker=3, job=JOB, round=5, chunk=chunk, nchunks=4, token=0) /
                 Raw(body))


@pytest.mark.root
def test_second_load_is_a_hit_whose_program_acks_a_real_packet(cache):
    from ltpx.dataplane.xdp import wire as W
    from ltpx.dataplane.xdp.loader import Dataplane, Geometry
    from ltpx.dataplane.xdp.testrun import XDP_TX, run_xdp
    g, before = Geometry(slots=2, max_chunks=64), counts()
    with Dataplane(g, job=JOB) as first:
        assert first.bpf.origin == "miss"
    with Dataplane(g, job=JOB) as dp:
        assert dp.bpf.origin == "hit"
        m = dp.maps()
        m.set_peers({3: 1})
        m.open_bank(5, 4, CHUNK, token=0)
        res = run_xdp(dp.prog_fd, data_packet(chunk=1))
        assert res.verdict == XDP_TX
        assert Ether(res.data)[W.LTP].type == W.T_ACK
        assert m.done_mask(5, 1, 4).tolist() == [False, True, False, False]
        got = m.mem_bytes[1, 1, CHUNK:2 * CHUNK].tobytes()
        assert got == np.arange(CHUNK // 4, dtype=np.float32).tobytes()
    assert delta(before) == {"misses": 1, "hits": 1}
    assert len(list(cache.glob("*.bpfo"))) == 1
    assert json.loads((cache / "stats.json").read_text())["hits"] == 1


def shape(t):
    """A ctypes type as sizes and names (bcc makes new classes per decode)."""
    import ctypes
    if t is None:
        return None
    if hasattr(t, "_length_"):
        return ("array", t._length_, shape(t._type_))
    return (ctypes.sizeof(t), [(f[0], shape(f[1])) for f in getattr(t, "_fields_", [])])


@pytest.mark.root
def test_cached_tables_have_bcc_s_ctypes(cache):
    """Key, Leaf and (per-CPU) sLeaf of a cached load equal those of bcc's own compile."""
    import bcc
    from ltpx import BPF_DIR
    from ltpx.dataplane.xdp.loader import compile_program
    ours, _ = compile_program("loss_tc.c", "loss_tc", prog_type="SCHED_CLS")
    theirs = bcc.BPF(src_file=str(BPF_DIR / "loss_tc.c").encode(),
                     cflags=[f"-I{BPF_DIR}", "-Wno-ignored-attributes"])
    try:
        assert type(ours).__name__ == "LoadedBpf"
        for name in (b"loss_cfg", b"loss_stats"):
            a, b = ours[name], theirs[name]
            for attr in ("Key", "Leaf", "sLeaf"):
                assert shape(getattr(a, attr, None)) == shape(getattr(b, attr, None)), \
                    (name, attr)
        assert shape(ours[b"loss_stats"].sLeaf) is not None     # per-CPU: both kinds there
    finally:
        ours.cleanup()
        theirs.cleanup()


# --- a small program of our own, to change its source and flags ---------------

PROG = """#include <uapi/linux/bpf.h>
#include "verdict.h"
BPF_ARRAY(hits, u32, 1);
int count(struct xdp_md *ctx) {
    int zero = 0;
    u32 *v = hits.lookup(&zero);
    if (v)
        __sync_fetch_and_add(v, 1);
    return VERDICT;
}
"""


@pytest.fixture
def src(tmp_path):
    d = tmp_path / "src"
    d.mkdir()
    (d / "prog.c").write_text(PROG)
    (d / "verdict.h").write_text('#include "inner.h"\n#define VERDICT XDP_PASS\n')
    (d / "inner.h").write_text("/* included by verdict.h */\n")
    return d


def load(src, *defines):
    """(obj, fn) of count() in src/prog.c through the cache."""
    import bcc
    from ltpx.dataplane.xdp import bpfcache
    flags = [f"-I{src}", *defines]
    return bpfcache.obtain(src / "prog.c", flags, "count", XDP_PROG,
                           lambda: bcc.BPF(src_file=str(src / "prog.c").encode(), cflags=flags))


def runs(obj, fn) -> tuple[int, int]:
    """(verdict, the program's own count after one run): the map works too."""
    import ctypes
    from ltpx.dataplane import clib
    from ltpx.dataplane.xdp.testrun import run_xdp
    res = run_xdp(fn.fd, bytes(Ether() / IP() / UDP()))
    v = ctypes.c_uint32()
    clib.map_lookup(obj[b"hits"].get_fd(), 0, v)
    obj.cleanup()
    return res.verdict, v.value


@pytest.mark.root
def test_changed_source_header_or_flags_is_a_miss(cache, src):
    from ltpx.dataplane.xdp.testrun import XDP_DROP, XDP_PASS
    before = counts()
    assert runs(*load(src)) == (XDP_PASS, 1)
    assert runs(*load(src)) == (XDP_PASS, 1)
    assert delta(before) == {"misses": 1, "hits": 1}
    before = counts()
    assert runs(*load(src, "-DUNUSED=1")) == (XDP_PASS, 1)          # other flags
    (src / "verdict.h").write_text('#include "inner.h"\n#define VERDICT XDP_DROP\n')
    assert runs(*load(src)) == (XDP_DROP, 1)                        # a header changed
    (src / "inner.h").write_text("/* changed: a header's header */\n")
    assert runs(*load(src)) == (XDP_DROP, 1)
    assert runs(*load(src)) == (XDP_DROP, 1)
    assert delta(before) == {"misses": 3, "hits": 1}
    assert len(list(cache.glob("*.bpfo"))) == 4


def _truncate(p):
    p.write_bytes(p.read_bytes()[:-100])


def _flip(p):
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0x20
    p.write_bytes(bytes(raw))


def _bad_instructions(p):
    """A whole, well-formed entry whose program the verifier refuses."""
    from ltpx.dataplane.xdp.bpfobj import Artefact
    art, meta = Artefact.from_bytes(p.read_bytes())
    art.functions["count"].insns = bytes([0xff] + [0] * 7) * 2
    art.functions["count"].maps = []
    p.write_bytes(art.to_bytes(meta))


def _owned_by_nobody(p):
    os.chown(p, 65534, 65534)


def _writable_by_all(p):
    p.chmod(0o666)


@pytest.mark.root
@pytest.mark.parametrize("spoil", [_truncate, _flip, _bad_instructions, _owned_by_nobody,
                                   _writable_by_all])
def test_a_corrupt_entry_is_compiled_again(cache, src, spoil, caplog):
    from ltpx.dataplane.xdp.testrun import XDP_PASS
    runs(*load(src))
    (entry,) = cache.glob("*.bpfo")
    spoil(entry)
    before = counts()
    with caplog.at_level(logging.WARNING, logger="ltpx.bpfcache"):
        obj, fn = load(src)
    assert obj.origin == "miss"
    assert runs(obj, fn) == (XDP_PASS, 1)
    assert delta(before) == {"recompiled": 1, "misses": 1}
    assert "compiling it again" in caplog.text
    obj, fn = load(src)                               # the new entry is whole
    assert obj.origin == "hit" and runs(obj, fn) == (XDP_PASS, 1)


CHILD = """
import json, sys
from ltpx.dataplane.xdp.loader import Dataplane, Geometry
from ltpx.dataplane.xdp.bpfcache import SESSION
from ltpx.dataplane.xdp.testrun import run_xdp
from scapy.layers.inet import IP, UDP, Ether
sys.stdout.write("ready\\n"); sys.stdout.flush(); sys.stdin.readline()
with Dataplane(Geometry(slots=3, max_chunks=192), job=5) as dp:
    v = run_xdp(dp.prog_fd, bytes(Ether() / IP() / UDP(dport=53))).verdict
    print(json.dumps({"origin": dp.bpf.origin, "verdict": v, "hits": SESSION["hits"],
                      "misses": SESSION["misses"], "notes": SESSION["notes"]}))
"""


@pytest.mark.root
def test_concurrent_first_compiles_make_one_compile_and_hits(cache):
    from ltpx.dataplane.xdp.testrun import XDP_PASS
    env = {**os.environ, "LTP_CACHE_DIR": str(cache)}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(5)]
    try:
        for p in procs:                   # all imported: now go at once
            assert p.stdout.readline() == "ready\n"
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        reap(procs)
    results = []
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out))
    assert all(r["verdict"] == XDP_PASS and not r["notes"] for r in results), results
    assert sorted(r["origin"] for r in results) == ["hit"] * 4 + ["miss"]
    assert len(list(cache.glob("*.bpfo"))) == 1
    assert not list(cache.glob(".tmp-*"))
    stats = json.loads((cache / "stats.json").read_text())
    assert (stats["misses"], stats["hits"]) == (1, 4)


def _parent_is_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    return tmp_path / "file" / "cache"


def _writable_by_others(tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    return d


@pytest.mark.root
@pytest.mark.parametrize("folder", [_parent_is_a_file, _writable_by_others])
def test_an_unusable_folder_means_compiling_with_a_note(tmp_path, monkeypatch, caplog, folder):
    from ltpx.dataplane.xdp.loader import compile_program
    from ltpx.dataplane.xdp.testrun import XDP_PASS, run_xdp
    d = folder(tmp_path)
    monkeypatch.setenv("LTP_CACHE_DIR", str(d))
    before = counts()
    with caplog.at_level(logging.WARNING, logger="ltpx.bpfcache"):
        b, fn = compile_program("xdp_pass.c", "xdp_pass")
    try:
        assert run_xdp(fn.fd, bytes(Ether() / IP() / UDP())).verdict == XDP_PASS
    finally:
        b.cleanup()
    assert delta(before) == {"uncached": 1}
    assert "BPF compile cache unusable" in caplog.text and str(d) in caplog.text
    assert not d.exists() or not list(d.glob("*.bpfo"))


@pytest.mark.root
def test_doctor_reports_the_cache(cache, src):
    from ltpx.dataplane.doctor import checks as doctor
    runs(*load(src))
    runs(*load(src))
    (check,) = [c for c in doctor.run_checks(compile_test=False) if c.name == "bpf-cache"]
    assert check.ok
    assert str(cache) in check.detail and "1 entries" in check.detail
    assert "1 hits" in check.detail and "1 misses" in check.detail


@pytest.mark.root
def test_a_dataplane_whose_setup_fails_closes_its_program_and_maps(cache):
    import gc
    from ltpx.dataplane.xdp.loader import Dataplane, Geometry
    g = Geometry(slots=2, max_chunks=64)
    with Dataplane(g, job=JOB):
        pass                                  # compiled: the failing ones below load it
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(2):
        with pytest.raises((ValueError, OverflowError)):
            Dataplane(g, job=2 ** 33)             # does not fit the job field
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.root
def test_the_doctor_makes_no_cache_folder(tmp_path, monkeypatch):
    from ltpx.dataplane.doctor import checks as doctor
    d = tmp_path / "not" / "yet"
    monkeypatch.setenv("LTP_CACHE_DIR", str(d))
    (check,) = [c for c in doctor.run_checks(compile_test=False) if c.name == "bpf-cache"]
    assert check.ok and "not made yet" in check.detail
    assert not (tmp_path / "not").exists()
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("LTP_CACHE_DIR", str(tmp_path / "file" / "cache"))
    (check,) = [c for c in doctor.run_checks(compile_test=False) if c.name == "bpf-cache"]
    assert "unusable" in check.detail and "is not a folder" in check.detail
