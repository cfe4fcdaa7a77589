# SPDX-License-Identifier: Apache-2.0
"""Checks that this machine can run LTP's dataplane, and the fixes for what is missing.

Each check returns (ok, detail, fix). `fix()` applies the repairs a program
may make on its own: the kernel-headers link and the bpffs mount. Package
installation is left to scripts/setup.sh, which names the packages.
"""
from __future__ import annotations

import glob
import os
import re
import subprocess
from dataclasses import dataclass

from ..clib import has_libbpf_symbol
from ..xdp import bpfcache
from ..xdp.loader import Dataplane, Geometry
from .growcheck import grow_verdict

BPFFS = "/sys/fs/bpf"
MIN_KERNEL = (5, 18)  # bpf_xdp_load_bytes


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    warn: bool = False   # an optional piece is missing: said, but the machine is ready

    def to_dict(self) -> dict:
        return {"name": self.name, "ok": self.ok, "detail": self.detail, "fix": self.fix,
                "warn": self.warn}


def _kernel_version() -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def headers_dir() -> str:
    return f"/lib/modules/{os.uname().release}/build"


def fallback_headers() -> tuple[str, str] | None:
    """Debian's linux-headers-*-amd64 (build) and -common (source) dirs, newest first."""
    for build in sorted(glob.glob("/usr/src/linux-headers-*-amd64"), reverse=True):
        common = build[: -len("-amd64")] + "-common"
        if os.path.isdir(common):
            return build, common
    return None


def bpffs_mounted() -> bool:
    """Is a bpffs mounted on /sys/fs/bpf in this process's mount namespace?"""
    try:
        with open("/proc/self/mounts") as f:
            return any(ln.split()[1:3] == [BPFFS, "bpf"] for ln in f)
    except OSError:
        return False


def run_checks(compile_test: bool = True) -> list[Check]:
    checks = []
    root = os.geteuid() == 0
    checks.append(Check("root", root, "running as root" if root else f"euid {os.geteuid()}",
                        "" if root else "run with sudo (BPF and namespaces need CAP_BPF, "
                        "CAP_NET_ADMIN, CAP_SYS_ADMIN)"))
    try:
        import bcc  # noqa: PLC0415 (optional: the check says how to install it)
        checks.append(Check("bcc", True, f"bcc at {os.path.dirname(bcc.__file__)}"))
        have_bcc = True
    except ImportError:
        have_bcc = False
        checks.append(Check("bcc", False, "python module bcc not importable",
                            "apt-get install python3-bpfcc and use a venv made with "
                            "/usr/bin/python3 -m venv --system-site-packages"))
    kv = _kernel_version()
    checks.append(Check("kernel", kv >= MIN_KERNEL, f"{os.uname().release}",
                        "" if kv >= MIN_KERNEL else f"needs Linux >= {MIN_KERNEL[0]}.{MIN_KERNEL[1]}"))
    btf = os.path.exists("/sys/kernel/btf/vmlinux")
    checks.append(Check("btf", btf, "/sys/kernel/btf/vmlinux" + (" present" if btf else " missing"),
                        "" if btf else "use a kernel built with CONFIG_DEBUG_INFO_BTF=y"))
    hd = headers_dir()
    has_headers = os.path.isdir(hd)
    fb = fallback_headers()
    checks.append(Check("kernel-headers", has_headers,
                        f"{hd} -> {os.path.realpath(hd)}" if has_headers else f"{hd} missing",
                        "" if has_headers else
                        (f"`ltp doctor --fix` links {fb[0]} as build and {fb[1]} as source"
                         if fb else "apt-get install linux-headers-amd64, then `ltp doctor --fix`")))
    mounted = bpffs_mounted()
    checks.append(Check("bpffs", mounted, f"{BPFFS} " + ("mounted" if mounted else "not mounted"),
                        "" if mounted else f"`ltp doctor --fix` mounts it (mount -t bpf bpf {BPFFS})"))
    if has_libbpf_symbol("bpf_prog_test_run_opts"):
        checks.append(Check("libbpf", True, "libbpf.so.1 with bpf_prog_test_run_opts"))
    else:
        checks.append(Check("libbpf", False, "libbpf.so.1 not loadable", "apt-get install libbpf1"))
    if compile_test and root and have_bcc and has_headers:
        try:
            with Dataplane(Geometry(slots=1, max_chunks=64)) as dp:
                how = {"hit": " (from the compile cache)", "miss": " (compiled, now cached)"}
                origin = how.get(getattr(dp.bpf, "origin", ""), " (compiled by bcc, not cached)")
            checks.append(Check("load", True, "ltp_xdp compiles and passes the verifier" + origin))
        except Exception as e:  # report, do not crash the doctor
            checks.append(Check("load", False, f"ltp_xdp failed to load: {e}",
                                "see the message; `ltp doctor` checks above name missing pieces"))
    if have_bcc:
        checks.append(cache_check())
    if compile_test and root and have_bcc and has_headers:
        checks.append(clock_check())
    if root:
        checks.append(ifb_check())
    return checks


def ifb_check(kind: str = "ifb") -> Check:
    """Can this kernel make an IFB device (a rig with nodes shapes each node's
    link with two: `ltp rig up --nodes`)? Tried in a throwaway namespace. Only
    such rigs need it: a failure is a warning."""
    from .. import netns                    # noqa: PLC0415 (only the doctor's root checks)
    from ..rig.netlink import iproute       # noqa: PLC0415
    ns = f"ltp-ifb{os.getpid()}"
    try:
        netns.create(ns)
        with iproute(ns) as ipr:
            ipr.link("add", ifname="ifbchk", kind=kind)
        return Check("ifb", True, "IFB devices can be made (rigs with nodes: `ltp rig up "
                     "--nodes`)")
    except Exception as e:      # report, do not crash the doctor
        return Check("ifb", True, f"unavailable ({e}): rigs with nodes (`ltp rig up --nodes`, "
                     "`ltp launch --colocate` over LTP) cannot be built; every other rig can. "
                     "`modprobe ifb`, or a kernel with CONFIG_IFB", warn=True)
    finally:
        if netns.exists(ns):
            netns.remove(ns)


def clock_check(mode: str = "native") -> Check:
    """Does a frame grow on a veth device (the ACK clock, `sender="xdp"`)?
    Its answer picks endpoints' default sender: the clock where it passes,
    else the socket sender. The clock is optional: a failure is a warning
    (the check stays ok, as the compile cache's does). Run afresh here; a
    definite answer replaces the one endpoints read (growcheck.grow_verdict)."""
    v = grow_verdict(mode, fresh=True)
    if v.ok:
        return Check("ack-clock", True, f"{v.detail}; endpoints send with the ACK clock "
                     f"(sender auto: xdp)")
    return Check("ack-clock", True, f"unavailable: endpoints fall back to the socket sender "
                 f"(the default where this check fails; --sender socket names it), which "
                 f"works without it: {v.detail}", warn=True)


def cache_check() -> Check:
    """The BPF compile cache: its folder, entries and counts. An unusable
    folder is no failure (every process compiles, as without a cache), so
    the check stays ok and says what to do."""
    s = bpfcache.summary()
    if not s["usable"]:
        return Check("bpf-cache", True, f"unusable, every process compiles (~2 s CPU): "
                     f"{s['reason']}; set {bpfcache.ENV} to a root-owned folder others "
                     f"cannot write")
    if s.get("missing"):
        return Check("bpf-cache", True, f"{s['dir']}: not made yet (the first compile makes it)")
    st = s["stats"]
    return Check("bpf-cache", True,
                 f"{s['dir']}: {s['entries']} entries, {s['bytes'] // 1024} KiB; "
                 f"{st.get('hits', 0)} hits, {st.get('misses', 0)} misses, "
                 f"{st.get('recompiled', 0)} recompiled"
                 + (f" since {st['since']}" if "since" in st else ""))


def device_check(dev: str, ns: str | None = None, ltp_mtu: int = 1500,
                 mode: str = "native") -> Check:
    """The device a rank will attach to (LTP_DEV): there; in native mode an
    MTU whose frames fit the one page native XDP takes (the program takes no
    fragments); and LTP's path MTU (LTP_MTU) no larger than the device's,
    whose frames would not leave it."""
    from ..xdp import lookup                      # noqa: PLC0415 (the --dev check's alone)
    from ..xdp.loader import native_mtu_problem   # noqa: PLC0415
    from ..xdp.wire import chunk_bytes_for        # noqa: PLC0415
    mtu = lookup.mtu(dev, ns)
    if mtu is None:
        return Check("device", False, f"no device {dev!r} here",
                     "give LTP_DEV (or --dev) one of `ip -br link`")
    problem = native_mtu_problem(dev, mtu) if mode == "native" else None
    if problem:
        return Check("device", False, *problem)
    if ltp_mtu > mtu:
        return Check("device", False, f"LTP_MTU {ltp_mtu} is over {dev}'s MTU {mtu}: LTP's "
                     "frames would not leave it", f"LTP_MTU={mtu} (the path's smallest MTU)")
    return Check("device", True, f"{dev}: MTU {mtu}, LTP_MTU {ltp_mtu} (chunks of "
                 f"{chunk_bytes_for(ltp_mtu)} bytes), XDP {mode}")


def fix() -> list[str]:
    """Apply the repairs that need no package manager; returns what was done."""
    done = []
    hd = headers_dir()
    if not os.path.isdir(hd):
        fb = fallback_headers()
        if fb:
            mod = os.path.dirname(hd)
            os.makedirs(mod, exist_ok=True)
            for name, target in (("build", fb[0]), ("source", fb[1])):
                link = os.path.join(mod, name)
                if os.path.islink(link):
                    os.unlink(link)
                os.symlink(target, link)
            done.append(f"linked {fb[0]} as {hd}")
    if not bpffs_mounted():
        os.makedirs(BPFFS, exist_ok=True)
        subprocess.run(["mount", "-t", "bpf", "bpf", BPFFS], check=True)
        done.append(f"mounted bpffs on {BPFFS}")
    return done
