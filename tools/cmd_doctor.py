# SPDX-License-Identifier: Apache-2.0
"""`ltp doctor`: is this machine ready for LTP's dataplane? `--fix` repairs what it can."""
from __future__ import annotations

from .common import EXIT_ERROR, LtpError, add_command, add_json, emit


def register(sub) -> None:
    p = add_command(sub, "doctor", "check root, bcc, kernel headers, bpffs, kernel, BTF and "
                    "the summing kernel",
                    epilog="examples:\n  ltp doctor\n  sudo ltp doctor --fix\n  ltp doctor -j\n"
                           "  sudo LTP_MTU=3500 ltp doctor --dev eth1\n\n"
                           "Exits 0 only when everything needed is there.\n")
    p.add_argument("--fix", action="store_true",
                   help="link Debian's kernel headers when missing and mount bpffs")
    p.add_argument("--no-load", action="store_true",
                   help="skip the compile-and-load checks (the BPF program's, the summing "
                        "kernel's)")
    p.add_argument("--dev", metavar="DEV",
                   help="also check the device a rank will attach to: there, an MTU native "
                        "XDP takes (LTP_XDP_MODE), LTP_MTU within it (default: LTP_DEV)")
    add_json(p)
    p.set_defaults(func=cmd_doctor)


def summing_check():
    """What a server sums with here: the C kernel (built now if need be) or,
    with a warning, the numpy path, the way to the kernel and why (the
    machine is ready either way)."""
    from ..control.settings_table import TABLE
    from ..control.transport import sumkernel
    from ..dataplane.doctor.checks import Check
    st = sumkernel.status()
    if st["kernel"] == "c":
        return Check("summing", True, f"C kernel ({st['isa']}): {st['path']}")
    why, cause = st["why"], st["cause"]
    how = {"setting": f"unset {TABLE['sum_kernel'].env} for the C kernel",
           "no-compiler": "install gcc or clang for the C kernel",
           "remembered": f"fix the compiler, then remove {st['file']}"}.get(
        cause, "fix the compiler's error for the C kernel")
    return Check("summing", True, f"numpy path, slower (the C kernel sums 1.4-2.2x faster): "
                 f"{how}; {why[:100]}", warn=True)


def cmd_doctor(args) -> int:
    import os
    from ..control import settings_table
    from ..dataplane.doctor import checks as doctor
    fixed = []
    if args.fix:
        if os.geteuid() != 0:
            raise LtpError("`ltp doctor --fix` needs root: run it with sudo")
        fixed = doctor.fix()
    dev = args.dev or settings_table.env("dev")      # a bad setting: a usage error, first
    mtu, mode = settings_table.env("mtu"), settings_table.env("xdp_mode")
    settings_table.env("sum_kernel")                 # read now: a bad one is a usage error
    checks = doctor.run_checks(compile_test=not args.no_load)
    if not args.no_load:
        checks.append(summing_check())
    if dev:
        checks.append(doctor.device_check(dev, ltp_mtu=mtu, mode=mode))
    ok = all(c.ok for c in checks)
    out = {"ok": ok, "fixed": fixed, "checks": [c.to_dict() for c in checks]}

    def text(o) -> str:
        lines = [f"fixed: {f}" for f in o["fixed"]]
        for c in o["checks"]:
            mark = "BAD" if not c["ok"] else "warn" if c.get("warn") else "ok"
            lines.append(f"{mark:<4} {c['name']:<15} {c['detail']}"[:200])
            if not c["ok"] and c["fix"]:
                lines.append(f"    fix: {c['fix']}")
        lines.append("ready" if o["ok"] else "not ready: apply the fixes above")
        return "\n".join(lines)

    emit(args, out, text)
    return 0 if ok else EXIT_ERROR
