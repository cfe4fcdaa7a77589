"""The one ctypes binding of the C libraries LTP calls: libbpf, libc, libbcc.

libbpf.so.1 gives the BPF syscalls on file descriptors (pins, kernel ids,
map elements, object info, links, BPF_PROG_TEST_RUN), so the same code serves
the process that loaded a program and one that opened it by pin or by id.
libc gives setns(2) and prctl(2). libbcc (bcc's own library, opened here a
second time with its own signatures) is read only for what the compile cache
keeps of a compiled module: its tables and its functions' instructions. Every
other module calls these functions; none loads a library.

Failures raise OSError with the errno and the call's name (FileNotFoundError
for ENOENT, as Python does); callers turn them into their own LtpError with
the fix to suggest.
"""
from __future__ import annotations

import ctypes
import os
from typing import Any

_libs: dict[str, Any] = {}

_c_int, _c_uint32, _vp = ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p


class LinkCreateOpts(ctypes.Structure):
    """struct bpf_link_create_opts (libbpf 1.x) up to `flags`: an XDP link
    needs nothing more, and libbpf reads only the first `sz` bytes."""

    _fields_ = [("sz", ctypes.c_size_t), ("flags", _c_uint32), ("pad", _c_uint32)]


class TestRunOpts(ctypes.Structure):
    """struct bpf_test_run_opts (libbpf 1.x)."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("data_in", _vp), ("data_out", _vp),
        ("data_size_in", _c_uint32), ("data_size_out", _c_uint32),
        ("ctx_in", _vp), ("ctx_out", _vp),
        ("ctx_size_in", _c_uint32), ("ctx_size_out", _c_uint32),
        ("retval", _c_uint32),
        ("repeat", _c_int),
        ("duration", _c_uint32),
        ("flags", _c_uint32),
        ("cpu", _c_uint32),
        ("batch_size", _c_uint32),
    ]


class MapCreateOpts(ctypes.Structure):
    """struct bpf_map_create_opts (libbpf 1.x) up to `map_flags`."""

    _fields_ = [("sz", ctypes.c_size_t), ("btf_fd", _c_uint32), ("btf_key_type_id", _c_uint32),
                ("btf_value_type_id", _c_uint32), ("btf_vmlinux_value_type_id", _c_uint32),
                ("inner_map_fd", _c_uint32), ("map_flags", _c_uint32)]


class ProgLoadOpts(ctypes.Structure):
    """struct bpf_prog_load_opts (libbpf 1.0-1.1 layout; later versions only append)."""

    _fields_ = [
        ("sz", ctypes.c_size_t), ("attempts", _c_int), ("expected_attach_type", _c_uint32),
        ("prog_btf_fd", _c_uint32), ("prog_flags", _c_uint32), ("prog_ifindex", _c_uint32),
        ("kern_version", _c_uint32), ("attach_btf_id", _c_uint32),
        ("attach_prog_fd", _c_uint32), ("attach_btf_obj_fd", _c_uint32),
        ("fd_array", _vp), ("func_info", _vp),
        ("func_info_cnt", _c_uint32), ("func_info_rec_size", _c_uint32),
        ("line_info", _vp), ("line_info_cnt", _c_uint32), ("line_info_rec_size", _c_uint32),
        ("log_level", _c_uint32), ("log_size", _c_uint32), ("log_buf", _vp),
    ]


# name -> (restype, argtypes) of every libbpf function used
_LIBBPF = {
    "bpf_obj_pin": (_c_int, [_c_int, ctypes.c_char_p]),
    "bpf_obj_get": (_c_int, [ctypes.c_char_p]),
    "bpf_obj_get_info_by_fd": (_c_int, [_c_int, _vp, ctypes.POINTER(_c_uint32)]),
    "bpf_map_lookup_elem": (_c_int, [_c_int, _vp, _vp]),
    "bpf_map_update_elem": (_c_int, [_c_int, _vp, _vp, ctypes.c_uint64]),
    "bpf_map_delete_elem": (_c_int, [_c_int, _vp]),
    "bpf_map_get_next_key": (_c_int, [_c_int, _vp, _vp]),
    "bpf_prog_test_run_opts": (_c_int, [_c_int, ctypes.POINTER(TestRunOpts)]),
    "libbpf_num_possible_cpus": (_c_int, []),
    "bpf_prog_get_fd_by_id": (_c_int, [_c_uint32]),
    "bpf_map_get_fd_by_id": (_c_int, [_c_uint32]),
    "bpf_link_get_fd_by_id": (_c_int, [_c_uint32]),
    "bpf_link_get_next_id": (_c_int, [_c_uint32, ctypes.POINTER(_c_uint32)]),
    "bpf_prog_get_next_id": (_c_int, [_c_uint32, ctypes.POINTER(_c_uint32)]),
    "bpf_map_get_next_id": (_c_int, [_c_uint32, ctypes.POINTER(_c_uint32)]),
    "bpf_link_create": (_c_int, [_c_int, _c_int, _c_int, _vp]),
    "bpf_link_detach": (_c_int, [_c_int]),
    "bpf_map_create": (_c_int, [_c_int, ctypes.c_char_p, _c_uint32, _c_uint32, _c_uint32, _vp]),
    "bpf_prog_load": (_c_int, [_c_int, ctypes.c_char_p, ctypes.c_char_p, _vp, ctypes.c_size_t,
                               _vp]),
}

# name -> (restype, argtypes) of the libbcc functions the compile cache reads a module with
_LIBBCC = {
    "bpf_num_tables": (ctypes.c_size_t, [_vp]),
    "bpf_table_name": (ctypes.c_char_p, [_vp, ctypes.c_size_t]),
    "bpf_table_fd_id": (_c_int, [_vp, ctypes.c_size_t]),
    "bpf_table_key_desc_id": (ctypes.c_char_p, [_vp, ctypes.c_size_t]),
    "bpf_table_leaf_desc_id": (ctypes.c_char_p, [_vp, ctypes.c_size_t]),
    "bpf_num_functions": (ctypes.c_size_t, [_vp]),
    "bpf_function_name": (ctypes.c_char_p, [_vp, ctypes.c_size_t]),
    "bpf_function_start": (_vp, [_vp, ctypes.c_char_p]),
    "bpf_function_size": (ctypes.c_size_t, [_vp, ctypes.c_char_p]),
    "bpf_module_license": (ctypes.c_char_p, [_vp]),
    "bpf_module_kern_version": (_c_uint32, [_vp]),
}


def _load(key: str, soname: str, signatures: dict) -> Any:
    """`soname` opened once per process with `signatures` set (OSError if it
    is not installed)."""
    lib = _libs.get(key)
    if lib is None:
        lib = ctypes.CDLL(soname, use_errno=True)
        for name, (res, args) in signatures.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        _libs[key] = lib
    return lib


def libbpf():
    """libbpf.so.1 with the signatures above (OSError if it is not installed)."""
    return _load("bpf", "libbpf.so.1", _LIBBPF)


def libbcc():
    """bcc's libbcc.so.0 with the signatures above (OSError if it is not installed)."""
    return _load("bcc", "libbcc.so.0", _LIBBCC)


def libc():
    lib = _libs.get("c")
    if lib is None:
        lib = _libs["c"] = ctypes.CDLL(None, use_errno=True)
    return lib


def has_libbpf_symbol(name: str) -> bool:
    """Does this machine's libbpf.so.1 export `name`? (for `ltp doctor`)"""
    try:
        return hasattr(ctypes.CDLL("libbpf.so.1"), name)
    except OSError:
        return False


def _check(rc: int, what: str) -> int:
    """libbpf returns -errno (and sets errno) on failure."""
    if rc < 0:
        err = ctypes.get_errno() or -rc
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


def _ref(obj):
    """A pointer to a ctypes value; an int is taken as a u32 key."""
    if obj is None:
        return None
    if isinstance(obj, int):
        obj = _c_uint32(obj)
    return ctypes.byref(obj)


# --- objects ---------------------------------------------------------------

def obj_pin(fd: int, path: str) -> None:
    _check(libbpf().bpf_obj_pin(fd, path.encode()), f"pinning {path}")


def obj_get(path: str) -> int:
    """fd of a pinned map or program (FileNotFoundError when not pinned)."""
    return _check(libbpf().bpf_obj_get(path.encode()), path)


def obj_info(fd: int, size: int = 256) -> bytes:
    """The kernel's bpf_prog_info / bpf_map_info of `fd`, as raw bytes."""
    buf = ctypes.create_string_buffer(size)
    n = _c_uint32(size)
    _check(libbpf().bpf_obj_get_info_by_fd(fd, buf, ctypes.byref(n)), "reading BPF object info")
    return buf.raw[:n.value]


def prog_fd_by_id(prog_id: int) -> int:
    """fd of the loaded program with kernel id `prog_id` (FileNotFoundError if gone)."""
    return _check(libbpf().bpf_prog_get_fd_by_id(prog_id), f"program id {prog_id}")


def map_fd_by_id(map_id: int) -> int:
    """fd of the map with kernel id `map_id` (FileNotFoundError if gone)."""
    return _check(libbpf().bpf_map_get_fd_by_id(map_id), f"map id {map_id}")


# struct bpf_prog_info: offsets of nr_map_ids (u32) and map_ids (u64 pointer)
PROG_INFO_NR_MAP_IDS, PROG_INFO_MAP_IDS = 52, 56


def prog_map_ids(fd: int, most: int = 64) -> list[int]:
    """Kernel ids of the maps the program `fd` uses (at most `most`)."""
    ids = (_c_uint32 * most)()
    buf = ctypes.create_string_buffer(256)
    _c_uint32.from_buffer(buf, PROG_INFO_NR_MAP_IDS).value = most
    ctypes.c_uint64.from_buffer(buf, PROG_INFO_MAP_IDS).value = ctypes.addressof(ids)
    n = _c_uint32(len(buf))
    _check(libbpf().bpf_obj_get_info_by_fd(fd, buf, ctypes.byref(n)), "reading program info")
    return list(ids[:min(_c_uint32.from_buffer(buf, PROG_INFO_NR_MAP_IDS).value, most)])


def link_fd_by_id(link_id: int) -> int:
    """fd of the BPF link with kernel id `link_id` (FileNotFoundError if gone)."""
    return _check(libbpf().bpf_link_get_fd_by_id(link_id), f"link id {link_id}")


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
    return _check(libbpf().libbpf_num_possible_cpus(), "libbpf_num_possible_cpus")


# --- map elements ------------------------------------------------------------

def map_lookup(fd: int, key, value) -> None:
    """Read the element at `key` (a ctypes value or a u32) into `value`."""
    _check(libbpf().bpf_map_lookup_elem(fd, _ref(key), _ref(value)), "map lookup")


def map_update(fd: int, key, value, flags: int = 0) -> None:
    _check(libbpf().bpf_map_update_elem(fd, _ref(key), _ref(value), flags), "map update")


def map_delete(fd: int, key) -> None:
    _check(libbpf().bpf_map_delete_elem(fd, _ref(key)), "map delete")


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
    return _check(libbpf().bpf_map_create(map_type, name.encode(), key_size, value_size,
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
    return _check(libbpf().bpf_link_create(prog_fd, target_fd, attach_type, ctypes.byref(opts)),
                  "creating a BPF link")


def link_detach(link_fd: int) -> None:
    """BPF_LINK_DETACH: detach the link's program now (the link stays, defunct)."""
    _check(libbpf().bpf_link_detach(link_fd), "detaching a BPF link")


# --- libc ------------------------------------------------------------------------

CLONE_NEWNET = 0x40000000
PR_SET_TIMERSLACK = 29
PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1
PR_SET_MM, PR_SET_MM_MAP = 35, 14


def setns(fd: int, nstype: int = CLONE_NEWNET) -> None:
    if libc().setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def set_timer_slack(ns: int) -> bool:
    """prctl(PR_SET_TIMERSLACK): how late this thread's sleeps may wake."""
    try:
        return libc().prctl(PR_SET_TIMERSLACK, ns, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def set_comm(name: str) -> bool:
    """prctl(PR_SET_NAME): this thread's name in /proc/PID/comm, top and ps
    (at most 15 bytes; longer is cut). False if the kernel refused."""
    buf = ctypes.create_string_buffer(os.fsencode(name)[:15], 16)
    try:
        return libc().prctl(PR_SET_NAME, buf, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def set_parent_death_signal(sig: int) -> None:
    """prctl(PR_SET_PDEATHSIG): this process gets `sig` when its parent dies
    (for a child's preexec: a job outlives no killed harness)."""
    if libc().prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")


class PrctlMmMap(ctypes.Structure):
    """struct prctl_mm_map (linux/prctl.h), for PR_SET_MM_MAP."""
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "start_code", "end_code", "start_data", "end_data", "start_brk", "brk", "start_stack",
        "arg_start", "arg_end", "env_start", "env_end", "auxv")] + [
        ("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]


_PROC_STRINGS: list = []     # the buffers /proc/self/cmdline and environ now point into


def set_proc_strings(argv: list[str], env: dict[str, str]) -> bool:
    """Make /proc/self/cmdline and /proc/self/environ read `argv` and `env`
    (prctl PR_SET_MM_MAP, the checkpoint/restore call: every other field as
    it is now), so a process forked from a fork server shows as the command
    it runs to ps and /proc readers. Call it with no other thread running.
    False if the kernel refused (nothing changed then)."""
    bufs = []
    for items in (argv, [f"{k}={v}" for k, v in env.items()]):
        data = b"".join(os.fsencode(s) + b"\0" for s in items) or b"\0"
        bufs.append((ctypes.create_string_buffer(data, len(data)), len(data)))
    with open("/proc/self/stat") as f:         # fields 3.. after the command's name
        st = [0, 0, 0, 0] + f.read().rsplit(")", 1)[1].split()[1:]
    field = [int(x) for x in st]
    (a, alen), (e, elen) = bufs
    m = PrctlMmMap(start_code=field[26], end_code=field[27], start_stack=field[28],
                   start_data=field[45], end_data=field[46], start_brk=field[47],
                   arg_start=ctypes.addressof(a), arg_end=ctypes.addressof(a) + alen,
                   env_start=ctypes.addressof(e), env_end=ctypes.addressof(e) + elen,
                   auxv=0, auxv_size=0, exe_fd=0xFFFFFFFF)
    sbrk = libc().sbrk
    sbrk.restype, sbrk.argtypes = ctypes.c_void_p, [ctypes.c_long]
    for _ in range(3):        # brk as it is: read just before, checked just after
        m.brk = sbrk(0) or 0
        if libc().prctl(PR_SET_MM, ctypes.c_ulong(PR_SET_MM_MAP), ctypes.byref(m),
                        ctypes.c_ulong(ctypes.sizeof(m)), ctypes.c_ulong(0)) != 0:
            return False
        _PROC_STRINGS.append(bufs)
        if (sbrk(0) or 0) == m.brk:
            break
    return True
