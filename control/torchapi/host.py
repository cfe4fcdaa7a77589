# SPDX-License-Identifier: Apache-2.0
"""What a rank needs from the host it runs on: its device's addresses, its route
to a server, and bpffs.

bpffs: an LTP endpoint pins its program and maps under /sys/fs/bpf. `ip netns
exec` (and so `ltp rig exec`, or torchrun started through either) runs its
command in a private mount namespace with a fresh sysfs on /sys, which hides
the host's bpffs. A rank then mounts a bpffs of its own on /sys/fs/bpf: the
mount lives in that private namespace only and goes with its last process.
The host's instance cannot be bind-mounted across mount namespaces, so `ltp
status` on the host does not see that rank's pins (it still sees the record
under /run/ltp/xdp); a rank started by `ltp launch` or `ltp train` enters
only the network namespace and uses the host's bpffs. Where no bpffs is
mounted at all (the host's own mount namespace), one is mounted as `ltp
doctor --fix` would.
"""
from __future__ import annotations

import fcntl
import logging
import os
import socket
import struct
import subprocess

from ...dataplane.doctor.checks import BPFFS, bpffs_mounted
from ...errors import UsageError, DataplaneError

log = logging.getLogger("ltpx.torch.host")   # users configure "ltpx.torch"

SIOCGIFADDR, SIOCGIFBRDADDR = 0x8915, 0x8919


def _ifreq_ipv4(dev: str, request: int) -> str:
    """The IPv4 address an SIOCGIF* ioctl gives for `dev` (OSError if none)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        raw = fcntl.ioctl(s.fileno(), request, struct.pack("256s", dev.encode()[:15]))
    finally:
        s.close()
    return socket.inet_ntoa(raw[20:24])


def rank_host(netns: str | None = None, node: str | None = None) -> str:
    """This rank's host as the job counts its local ranks: the machine's
    name and, for a rank on a rig, its node (the `node` setting: ranks each
    in a namespace of its own behind one shared link), else its named
    network namespace, which is a host of its own there."""
    name = socket.gethostname()
    where = node or netns
    return f"{name}/{where}" if where else name


def dev_ipv4(dev: str) -> str:
    """The IPv4 address of `dev` in this network namespace."""
    try:
        return _ifreq_ipv4(dev, SIOCGIFADDR)
    except OSError as e:
        raise UsageError(f"device {dev}: no IPv4 address ({e.strerror}); give the rank's "
                         "address (--ip, LTP_IP or init(ip=...))") from None


def dev_broadcast(dev: str) -> str | None:
    """The IPv4 broadcast address of `dev`'s address, or None if it has none."""
    try:
        addr = _ifreq_ipv4(dev, SIOCGIFBRDADDR)
    except OSError:
        return None
    return None if addr == "0.0.0.0" else addr


def ensure_bpffs() -> str | None:
    """Make /sys/fs/bpf a bpffs if it is not one (see the module docstring);
    returns what was done, or None. DataplaneError if it cannot be mounted."""
    if bpffs_mounted():
        return None
    try:
        os.makedirs(BPFFS, exist_ok=True)
        out = subprocess.run(["mount", "-t", "bpf", "bpf", BPFFS], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as e:
        raise DataplaneError(f"{BPFFS} is not a bpffs and mounting one failed: {e}; "
                             "run `ltp doctor --fix` on the host, and start ranks in the "
                             "network namespace only (nsenter --net=/run/netns/NAME)") from None
    if out.returncode != 0:
        raise DataplaneError(f"{BPFFS} is not a bpffs and `mount -t bpf` failed: "
                             f"{out.stderr.strip() or out.returncode} (needs root)")
    note = (f"ltpx: mounted bpffs on {BPFFS}: none was mounted in this mount namespace "
            "(`ip netns exec` hides the host's)")
    log.warning(note)
    return note


def route_to(ip: str) -> tuple[str, str]:
    """(device, source address) this namespace's route to `ip` leaves by."""
    from pyroute2 import IPRoute  # noqa: PLC0415 (0.15 s to import; only what touches links)
    with IPRoute() as ipr:
        try:
            r = ipr.route("get", dst=ip)[0]
        except Exception as e:   # pyroute2's NetlinkError: no route
            raise UsageError(f"no route to server {ip}: {e}") from None
        dev = ipr.get_links(r.get_attr("RTA_OIF"))[0].get_attr("IFLA_IFNAME")
        return dev, r.get_attr("RTA_PREFSRC")
