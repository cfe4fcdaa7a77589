# SPDX-License-Identifier: Apache-2.0
"""libc calls on this process: setns(2) and prctl(2) (timer slack, thread
name, parent-death signal, /proc/self/cmdline and environ)."""
from __future__ import annotations

import ctypes
import os

from .libs import libc

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
