# SPDX-License-Identifier: Apache-2.0
"""The TCP transport's local hop: a worker on its server's own host reaches it
by a Unix stream socket, not through the host's TCP/IP stack.

A co-located server (one beside each trainer) or one server on a GPU node
takes a piece of every worker's gradient from its own host. Over loopback
TCP each byte goes through the TCP/IP stack twice; a Unix socket moves the
same stream with a copy in and a copy out (1.6-1.9x loopback TCP's rate on
this project's 2-core VM, `scripts/ab_loopback.py` for the job's figure).
The stream, its hello (MAC under the job key) and the pieces are the TCP
transport's, unchanged.

The server binds a socket file in a directory of this user's only
(`DIR`, 0700, refused when another user owns it or others may write it),
named by its TCP address and its pid, and says its path beside its port.
A worker uses it when the server's host (`host.rank_host`: the machine,
and on a rig the node) is its own and the file is there, else TCP. The
server removes the file once its workers are in, and at close; a file
whose server died (pid gone) is swept when the next server on the host
binds. `tcp_local` (LTP_TCP_LOCAL=0) keeps every worker on TCP.
"""
from __future__ import annotations

import logging
import os
import socket
import stat
import tempfile

log = logging.getLogger("ltpx.torch.tcp")

PREFIX = "tcp-"


def local_dir() -> str | None:
    """This user's directory for the sockets (made 0700 if missing); None,
    logged, where it is not this user's alone (another user could bind or
    swap a socket there)."""
    path = os.path.join(tempfile.gettempdir(), f"ltpx-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        log.info("ltpx: no directory for local sockets (%s): local workers use TCP", e)
        return None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        log.warning("ltpx: %s is not a directory of this user's alone (mode %o, owner %d): "
                    "local workers use TCP", path, stat.S_IMODE(st.st_mode), st.st_uid)
        return None
    return path


def sweep(path: str) -> int:
    """Remove the socket files in `path` whose server is gone; how many."""
    gone = 0
    for name in os.listdir(path):
        if not (name.startswith(PREFIX) and name.endswith(".sock")):
            continue
        try:
            pid = int(name[:-len(".sock")].rsplit("-", 1)[1])
            os.kill(pid, 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(path, name))
                gone += 1
            except FileNotFoundError:
                pass
        except (ValueError, IndexError, PermissionError):
            continue    # not ours to judge (PermissionError: that pid lives)
    return gone


def listen_local(ip: str, port: int, backlog: int) -> tuple[socket.socket | None, str | None]:
    """A Unix listener for the TCP server at ip:port, and its path; (None,
    None) where this host has no directory for it."""
    where = local_dir()
    if where is None:
        return None, None
    sweep(where)
    path = os.path.join(where, f"{PREFIX}{ip}-{port}-{os.getpid()}.sock")
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        ls.bind(path)
        ls.listen(backlog)
    except OSError as e:
        ls.close()
        log.info("ltpx: no local socket at %s (%s): local workers use TCP", path, e)
        return None, None
    return ls, path


def unlisten(ls: socket.socket | None, path: str | None) -> None:
    """Close a Unix listener and remove its file."""
    if ls is not None:
        ls.close()
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def connect_local(server: dict, my_host: str, timeout_s: float) -> socket.socket | None:
    """A connection to `server` (its meta) by its Unix socket, where it is on
    `my_host` and has one; None otherwise, or where the file cannot be
    reached (the caller then uses TCP)."""
    path = server.get("unix")
    if not path or server.get("host") != my_host:
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout_s)
    try:
        s.connect(path)
    except OSError as e:
        s.close()
        log.info("ltpx: the server's local socket %s: %s: by TCP", path, e)
        return None
    return s
