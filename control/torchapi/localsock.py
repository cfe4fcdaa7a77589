# SPDX-License-Identifier: Apache-2.0
"""The TCP transport's local hop: a worker on its server's own host reaches it
by a Unix stream socket, not through the host's TCP/IP stack.

A co-located server (one beside each trainer) or one server on a GPU node
takes a piece of every worker's gradient from its own host. Over loopback
TCP each byte goes through the TCP/IP stack twice; a Unix socket moves the
same stream with a copy in and a copy out (the links' round trip 1.42x
loopback TCP's on this project's 2-core VM, `scripts/ab_tcp_local.py`).
The stream, its hello (MAC under the job key) and the pieces are the TCP
transport's, unchanged.

The server binds a socket file in a directory of this user's only
(`$TMPDIR/ltpx-<uid>`, 0700; refused when another user owns it, others may
write it, or its parent is writable by all without the sticky bit), named
by its TCP address, its pid namespace and pid, and says its path and its
network namespace beside its port. A worker uses it when the server's
host (`host.rank_host`: the machine, and on a rig the node) and network
namespace are its own and the file answers, else TCP. The server removes
the file once its workers are in, and at close; a file whose server died
(its pid gone, in this pid namespace) is swept when the next server on the
host binds. `tcp_local` (LTP_TCP_LOCAL=0) keeps every worker on TCP.

Where a rank is: `here()` (its network namespace, as the calling thread
sees it, and the machine's boot id) goes into its meta, and `on_host`
says whether another rank's meta is this host and namespace (the LTP
links' test for a peer off the wire, link_ltp_near.py).
"""
from __future__ import annotations

import functools
import logging
import os
import socket
import stat
import tempfile

log = logging.getLogger("ltpx.torch.tcp")

PREFIX = "tcp-"
CONNECT_S = 5.0     # a local connect's limit: then TCP, with the job's timeout (a full
                    # backlog refuses a Unix connect at once: TCP then too)


def ns_id(kind: str) -> int:
    """The calling thread's `kind` namespace (net, pid) as its inode; 0
    unknown. The thread's, not the process's: /proc/self is the main
    thread, which may be inside another network namespace just then (a
    store connection opened from the store's: netns.inside), while a
    co-located server's thread asks where it is."""
    for base in ("/proc/thread-self", "/proc/self"):
        try:
            return os.stat(f"{base}/ns/{kind}").st_ino
        except OSError:
            continue
    return 0


def local_dir() -> str | None:
    """This user's directory for the sockets (made 0700 if missing); None,
    logged, where it is not this user's alone (another user could bind or
    swap a socket there)."""
    parent = tempfile.gettempdir()
    path = os.path.join(parent, f"ltpx-{os.getuid()}")
    try:
        up = os.stat(parent)
        if up.st_mode & stat.S_IWOTH and not up.st_mode & stat.S_ISVTX:
            raise PermissionError(f"{parent} is writable by all and not sticky")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(path)
    except OSError as e:
        log.info("ltpx: no directory for local sockets (%s): local workers use TCP", e)
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        log.warning("ltpx: %s is not a directory of this user's alone (mode %o, owner %d): "
                    "local workers use TCP", path, stat.S_IMODE(st.st_mode), st.st_uid)
        return None
    return path


def sweep(path: str) -> int:
    """Remove the socket files in `path` whose server is gone (its pid, in
    this pid namespace: another namespace's files are not ours to judge);
    how many."""
    gone, mine = 0, f"-{ns_id('pid')}"
    for name in os.listdir(path):
        if not (name.startswith(PREFIX) and name.endswith(".sock")):
            continue
        head, _, pid = name[:-len(".sock")].rpartition("-")
        if not head.endswith(mine) or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(path, name))
                gone += 1
            except FileNotFoundError:
                pass
        except (OSError, OverflowError):
            continue    # it lives (PermissionError: another user's), or no pid at all
    return gone


def listen_local(ip: str, port: int, backlog: int) -> tuple[socket.socket | None, str | None]:
    """A Unix listener for the TCP server at ip:port, and its path; (None,
    None), logged, where this host has no place for it (the job goes on by TCP)."""
    ls = None
    try:
        where = local_dir()
        if where is None:
            return None, None
        sweep(where)
        path = os.path.join(where, f"{PREFIX}{ip}-{port}-{ns_id('pid')}-{os.getpid()}.sock")
        ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ls.bind(path)
        ls.listen(backlog)
        return ls, path
    except Exception as e:   # never the server's start: its workers come by TCP
        if ls is not None:
            ls.close()
        log.info("ltpx: no local socket for the TCP server at %s:%d (%s): local workers "
                 "use TCP", ip, port, e)
        return None, None


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
    `my_host` and in this network namespace and has one; None otherwise, or
    where the file does not answer within CONNECT_S (the caller then uses TCP)."""
    path = server.get("unix")
    if not path or server.get("host") != my_host or server.get("netns_id") != ns_id("net"):
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(min(timeout_s, CONNECT_S))
    try:
        s.connect(path)
    except (OSError, TypeError, ValueError) as e:
        s.close()
        log.info("ltpx: the server's local socket %s: %s: by TCP", path, e)
        return None
    s.settimeout(timeout_s)
    return s


@functools.cache
def boot_id() -> str:
    """This machine's boot (the kernel's random boot_id): two hosts that
    share a name and a network namespace inode (every root one has the same)
    are still two."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def here() -> dict:
    """What a rank's meta says of where it is, for on_host."""
    return {"netns_id": ns_id("net"), "boot": boot_id()}


def on_host(meta: dict, host: str) -> bool:
    """Whether the rank of `meta` is on this host (the same name and boot),
    in this network namespace: a frame between the two never reaches a NIC."""
    mine = here()
    return meta.get("host") == host and bool(mine["boot"]) and \
        all(meta.get(k) == v for k, v in mine.items())
