# SPDX-License-Identifier: Apache-2.0
"""Network namespaces: create, remove, and run code inside one.

Setting a namespace is per thread (setns(2)), so `inside(name)` switches the
calling thread and always switches back. Library code uses pyroute2 for links
and this module for the namespace switch; nothing here touches the machine's
own namespace beyond creating and removing named namespaces in /run/netns.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from pyroute2 import netns as _netns

from .clib import setns as _setns
import threading
import subprocess

NETNS_DIR = "/run/netns"


def exists(name: str) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, name))


def current() -> str | None:
    """The name (in /run/netns) of this thread's network namespace, or None
    for the machine's own or an unnamed one."""
    try:
        here = os.stat(f"/proc/self/task/{_gettid()}/ns/net")
        names = os.listdir(NETNS_DIR)
    except OSError:
        return None
    for name in names:
        try:
            st = os.stat(os.path.join(NETNS_DIR, name))
        except OSError:
            continue
        if (st.st_ino, st.st_dev) == (here.st_ino, here.st_dev):
            return name
    return None


def listnetns() -> list[str]:
    return sorted(_netns.listnetns())


def create(name: str) -> None:
    """Create a named namespace with its loopback up (idempotent)."""
    if not exists(name):
        _netns.create(name)
    from pyroute2 import IPRoute  # noqa: PLC0415 (0.15 s to import; only what touches links)
    with inside(name):     # not IPRoute(netns=...): that forks a helper process
        ipr = IPRoute()
    with ipr:
        lo = ipr.link_lookup(ifname="lo")
        if lo:
            ipr.link("set", index=lo[0], state="up")


def remove(name: str) -> None:
    """Remove a named namespace; its veths and attached XDP programs go with it."""
    if exists(name):
        _netns.remove(name)


@contextlib.contextmanager
def inside(name: str | None) -> Iterator[None]:
    """Run the body with this thread in namespace `name` (None: stay put)."""
    if not name:
        yield
        return
    path = os.path.join(NETNS_DIR, name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"network namespace {name!r} does not exist ({path})")
    here = os.open(f"/proc/self/task/{_gettid()}/ns/net", os.O_RDONLY)
    try:
        there = os.open(path, os.O_RDONLY)
        try:
            _setns(there)
        finally:
            os.close(there)
        try:
            yield
        finally:
            _setns(here)
    finally:
        os.close(here)


def _gettid() -> int:
    return threading.get_native_id()


def popen(name: str, argv: list[str], **kwargs):
    """Start a process inside namespace `name` (setns in the child before exec)."""
    path = os.path.join(NETNS_DIR, name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"network namespace {name!r} does not exist ({path})")

    def enter() -> None:
        fd = os.open(path, os.O_RDONLY)
        _setns(fd)
        os.close(fd)

    return subprocess.Popen(argv, preexec_fn=enter, **kwargs)
