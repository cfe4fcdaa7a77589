# SPDX-License-Identifier: Apache-2.0
"""The BPF syscalls on file descriptors, through libbpf: pins, kernel ids,
object info, map elements, BPF_PROG_TEST_RUN, loading raw instructions,
links; and what the compile cache reads of a compiled bcc module."""
from __future__ import annotations

import ctypes
import os
from typing import Any

from .libs import (LinkCreateOpts, MapCreateOpts, ProgLoadOpts, TestRunOpts, check, libbcc,
                   libbpf, ref)

_c_uint32 = ctypes.c_uint32


# --- objects ---------------------------------------------------------------

def obj_pin(fd: int, path: str) -> None:
    check(libbpf().bpf_obj_pin(fd, path.encode()), f"pinning {path}")


def obj_get(path: str) -> int:
    """fd of a pinned map or program (FileNotFoundError when not pinned)."""
    return check(libbpf().bpf_obj_get(path.encode()), path)


def obj_info(fd: int, size: int = 256) -> bytes:
    """The kernel's bpf_prog_info / bpf_map_info of `fd`, as raw bytes."""
    buf = ctypes.create_string_buffer(size)
    n = _c_uint32(size)
    check(libbpf().bpf_obj_get_info_by_fd(fd, buf, ctypes.byref(n)), "reading BPF object info")
    return buf.raw[:n.value]


def prog_fd_by_id(prog_id: int) -> int:
    """fd of the loaded program with kernel id `prog_id` (FileNotFoundError if gone)."""
    return check(libbpf().bpf_prog_get_fd_by_id(prog_id), f"program id {prog_id}")


def map_fd_by_id(map_id: int) -> int:
    """fd of the map with kernel id `map_id` (FileNotFoundError if gone)."""
    return check(libbpf().bpf_map_get_fd_by_id(map_id), f"map id {map_id}")


# struct bpf_prog_info: offsets of nr_map_ids (u32) and map_ids (u64 pointer)
PROG_INFO_NR_MAP_IDS, PROG_INFO_MAP_IDS = 52, 56


def prog_map_ids(fd: int, most: int = 64) -> list[int]:
    """Kernel ids of the maps the program `fd` uses (at most `most`)."""
    ids = (_c_uint32 * most)()
    buf = ctypes.create_string_buffer(256)
    _c_uint32.from_buffer(buf, PROG_INFO_NR_MAP_IDS).value = most
    ctypes.c_uint64.from_buffer(buf, PROG_INFO_MAP_IDS).value = ctypes.addressof(ids)
    n = _c_uint32(len(buf))
    check(libbpf().bpf_obj_get_info_by_fd(fd, buf, ctypes.byref(n)), "reading program info")
    return list(ids[:min(_c_uint32.from_buffer(buf, PROG_INFO_NR_MAP_IDS).value, most)])


def link_fd_by_id(link_id: int) -> int:
    """fd of the BPF link with kernel id `link_id` (FileNotFoundError if gone)."""
    return check(libbpf().bpf_link_get_fd_by_id(link_id), f"link id {link_id}")


def link_ids() -> list[int]:
    """Kernel ids of every BPF link on the machine, in id order."""
    lib, out, nxt = libbpf(), [], _c_uint32(0)
    while lib.bpf_link_get_next_id(out[-1] if out else 0, ctypes.byref(nxt)) == 0:
        out.append(nxt.value)
    return out


def prog_ids() -> list[int]:
    """Kernel ids of every BPF program loaded on the machine, in id order."""
    return _ids(libbpf().bpf_prog_get_next_id)


def map_ids() -> list[int]:
    """Kernel ids of every BPF map on the machine, in id order."""
    return _ids(libbpf().bpf_map_get_next_id)


def _ids(get_next) -> list[int]:
    """Walk one of the kernel's id spaces with its bpf_*_get_next_id (it
    answers ENOENT past the last id)."""
    out, nxt = [], _c_uint32(0)
    while get_next(out[-1] if out else 0, ctypes.byref(nxt)) == 0:
        out.append(nxt.value)
    return out


def num_possible_cpus() -> int:
    """Possible CPUs: the stride of per-CPU map values."""
    return check(libbpf().libbpf_num_possible_cpus(), "libbpf_num_possible_cpus")


# --- map elements ------------------------------------------------------------

def map_lookup(fd: int, key, value) -> None:
    """Read the element at `key` (a ctypes value or a u32) into `value`."""
    check(libbpf().bpf_map_lookup_elem(fd, ref(key), ref(value)), "map lookup")


def map_update(fd: int, key, value, flags: int = 0) -> None:
    check(libbpf().bpf_map_update_elem(fd, ref(key), ref(value), flags), "map update")


def map_delete(fd: int, key) -> None:
    check(libbpf().bpf_map_delete_elem(fd, ref(key)), "map delete")


def map_items(fd: int, key_type, value_type) -> list:
    """Every (key, value) of a hash map, as ctypes copies."""
    lib, out = libbpf(), []
    nxt, val, prev = key_type(), value_type(), None
    while lib.bpf_map_get_next_key(fd, prev, ctypes.byref(nxt)) == 0:
        if lib.bpf_map_lookup_elem(fd, ctypes.byref(nxt), ctypes.byref(val)) == 0:
            out.append((key_type.from_buffer_copy(nxt), value_type.from_buffer_copy(val)))
        prev = ctypes.byref(key_type.from_buffer_copy(nxt))
    return out


# --- programs ------------------------------------------------------------------

def prog_test_run(fd: int, opts: TestRunOpts) -> None:
    """BPF_PROG_TEST_RUN with `opts` (results land in it)."""
    if libbpf().bpf_prog_test_run_opts(fd, ctypes.byref(opts)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"BPF_PROG_TEST_RUN: {os.strerror(err)}")


LOG_BYTES = 1 << 22     # the verifier's log of a rejected program (its tail is reported)


def map_create(map_type: int, name: str, key_size: int, value_size: int, max_entries: int,
               flags: int = 0) -> int:
    """BPF_MAP_CREATE: fd of a new map (no BTF)."""
    opts = MapCreateOpts(sz=ctypes.sizeof(MapCreateOpts), map_flags=flags)
    return check(libbpf().bpf_map_create(map_type, name.encode(), key_size, value_size,
                                          max_entries, ctypes.byref(opts)),
                  f"creating map {name}")


def prog_load(prog_type: int, name: str, license: str, insns: bytes,
              kern_version: int = 0) -> int:
    """BPF_PROG_LOAD of raw instructions: the program's fd. A rejection is
    retried once with the verifier's log, whose tail ends the OSError's message."""
    lib, buf = libbpf(), ctypes.create_string_buffer(insns, len(insns))
    opts = ProgLoadOpts(sz=ctypes.sizeof(ProgLoadOpts), kern_version=kern_version)
    fd = lib.bpf_prog_load(prog_type, name.encode(), license.encode(), buf, len(insns) // 8,
                           ctypes.byref(opts))
    if fd >= 0:
        return fd
    err = ctypes.get_errno() or -fd
    log = ctypes.create_string_buffer(LOG_BYTES)
    opts.log_level, opts.log_size, opts.log_buf = 1, LOG_BYTES, ctypes.addressof(log)
    fd = lib.bpf_prog_load(prog_type, name.encode(), license.encode(), buf, len(insns) // 8,
                           ctypes.byref(opts))
    if fd >= 0:                    # loaded on the second try (EAGAIN and the like)
        return fd
    tail = " | ".join(log.value.decode(errors="replace").strip().splitlines()[-6:])
    raise OSError(err, f"loading program {name}: {os.strerror(err)}"
                  + (f" (verifier: {tail})" if tail else ""))


# --- bcc modules (what the compile cache keeps) -----------------------------------

def bcc_tables(module: int) -> list[dict[str, Any]]:
    """Every table of a compiled bcc module: name, fd, key and leaf descriptions (JSON)."""
    lib = libbcc()
    return [{"name": lib.bpf_table_name(module, i).decode(), "fd": lib.bpf_table_fd_id(module, i),
             "key_desc": (lib.bpf_table_key_desc_id(module, i) or b"").decode(),
             "leaf_desc": (lib.bpf_table_leaf_desc_id(module, i) or b"").decode()}
            for i in range(lib.bpf_num_tables(module))]


def bcc_functions(module: int) -> dict[str, bytes]:
    """Every function of a compiled bcc module -> its instructions (map fds in place)."""
    lib, out = libbcc(), {}
    for i in range(lib.bpf_num_functions(module)):
        name = lib.bpf_function_name(module, i)
        start, size = lib.bpf_function_start(module, name), lib.bpf_function_size(module, name)
        if start:
            out[name.decode()] = ctypes.string_at(start, size)
    return out


def bcc_license(module: int) -> tuple[str, int]:
    """(license, kern_version) of a compiled bcc module."""
    lib = libbcc()
    return (lib.bpf_module_license(module) or b"GPL").decode(), lib.bpf_module_kern_version(module)


# --- links -------------------------------------------------------------------

BPF_XDP = 37            # enum bpf_attach_type (linux/bpf.h)
BPF_LINK_TYPE_XDP = 6   # enum bpf_link_type


def link_create(prog_fd: int, target_fd: int, attach_type: int, flags: int = 0) -> int:
    """BPF_LINK_CREATE: fd of a new link of `prog_fd` to `target_fd` (for
    BPF_XDP, an ifindex of this thread's network namespace). The attachment
    lasts as long as the link: its last fd closing (or its owner dying)
    detaches the program, unless the link is pinned."""
    opts = LinkCreateOpts(sz=ctypes.sizeof(LinkCreateOpts), flags=flags)
    return check(libbpf().bpf_link_create(prog_fd, target_fd, attach_type, ctypes.byref(opts)),
                  "creating a BPF link")


def link_update(link_fd: int, prog_fd: int) -> None:
    """BPF_LINK_UPDATE: the link's program becomes `prog_fd`, at once: every
    frame after it runs the new program, none meets no program."""
    check(libbpf().bpf_link_update(link_fd, prog_fd, None), "updating a BPF link")


def link_detach(link_fd: int) -> None:
    """BPF_LINK_DETACH: detach the link's program now (the link stays, defunct)."""
    check(libbpf().bpf_link_detach(link_fd), "detaching a BPF link")

