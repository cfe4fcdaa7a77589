# SPDX-License-Identifier: Apache-2.0
"""The C libraries opened once per process, with the signatures of every
function LTP calls: libbpf.so.1, bcc's libbcc.so.0 (opened a second time with
its own signatures), libc, and the summing kernel LTP builds itself
(control/transport/sumkernel.py); the option structs those calls take; and the
two helpers every binding uses (`check` for libbpf's -errno returns, `ref`
for pointers to ctypes values)."""
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
    "bpf_link_update": (_c_int, [_c_int, _c_int, _vp]),
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


# the server's summing kernel, control/transport/sumkernel.c
_SUMKERNEL = {
    "ltp_sum_rows": (_c_int, [ctypes.POINTER(_vp), _vp, _c_int, ctypes.POINTER(_vp), _c_int, _vp,
                              ctypes.c_size_t, ctypes.c_float, _c_int]),
    "ltp_sum_isa": (_c_int, []),
    "ltp_sum_use": (_c_int, [_c_int]),
}


def load(key: str, soname: str, signatures: dict) -> Any:
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
    return load("bpf", "libbpf.so.1", _LIBBPF)


def libbcc():
    """bcc's libbcc.so.0 with the signatures above (OSError if it is not installed)."""
    return load("bcc", "libbcc.so.0", _LIBBCC)


def sumkernel(path: str):
    """The summing kernel built at `path`, opened once per process and path
    (OSError if it does not load)."""
    return load(f"sum:{path}", path, _SUMKERNEL)


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


def check(rc: int, what: str) -> int:
    """libbpf returns -errno (and sets errno) on failure."""
    if rc < 0:
        err = ctypes.get_errno() or -rc
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


def ref(obj):
    """A pointer to a ctypes value; an int is taken as a u32 key."""
    if obj is None:
        return None
    if isinstance(obj, int):
        obj = _c_uint32(obj)
    return ctypes.byref(obj)

