# SPDX-License-Identifier: Apache-2.0
"""The one ctypes binding of the C libraries LTP calls: libbpf, libc, libbcc.

libbpf.so.1 gives the BPF syscalls on file descriptors (pins, kernel ids,
map elements, object info, links, BPF_PROG_TEST_RUN), so the same code serves
the process that loaded a program and one that opened it by pin or by id.
libc gives setns(2) and prctl(2). libbcc (bcc's own library, opened here a
second time with its own signatures) is read only for what the compile cache
keeps of a compiled module: its tables and its functions' instructions. Every
other module calls these functions through this package; none loads a library.

- libs.py: the libraries, their signatures, the option structs, check/ref
- bpfsys.py: objects, ids, map elements, programs, bcc modules, links
- proc.py: setns and prctl on this process

Failures raise OSError with the errno and the call's name (FileNotFoundError
for ENOENT, as Python does); callers turn them into their own LtpError with
the fix to suggest.
"""
from __future__ import annotations

from .bpfsys import (BPF_LINK_TYPE_XDP, BPF_XDP, LOG_BYTES, bcc_functions, bcc_license,
                     bcc_tables, link_create, link_detach, link_fd_by_id, link_ids, link_update,
                     map_create,
                     map_delete, map_fd_by_id, map_ids, map_items, map_lookup, map_update,
                     num_possible_cpus, obj_get, obj_info, obj_pin, prog_fd_by_id, prog_ids,
                     prog_load, prog_map_ids, prog_test_run)
from .libs import (LinkCreateOpts, MapCreateOpts, ProgLoadOpts, TestRunOpts, has_libbpf_symbol,
                   libbcc, libbpf, libc)
from .proc import (CLONE_NEWNET, set_comm, set_parent_death_signal, set_proc_strings,
                   set_timer_slack, setns)

__all__ = [
    "BPF_LINK_TYPE_XDP", "BPF_XDP", "CLONE_NEWNET", "LOG_BYTES", "LinkCreateOpts",
    "MapCreateOpts", "ProgLoadOpts", "TestRunOpts", "bcc_functions", "bcc_license", "bcc_tables",
    "has_libbpf_symbol", "libbcc", "libbpf", "libc", "link_create", "link_detach",
    "link_fd_by_id", "link_ids", "link_update", "map_create", "map_delete", "map_fd_by_id", "map_ids",
    "map_items", "map_lookup", "map_update", "num_possible_cpus", "obj_get", "obj_info",
    "obj_pin", "prog_fd_by_id", "prog_ids", "prog_load", "prog_map_ids", "prog_test_run",
    "set_comm", "set_parent_death_signal", "set_proc_strings", "set_timer_slack", "setns",
]
