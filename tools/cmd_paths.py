# SPDX-License-Identifier: Apache-2.0
"""`ltp paths`: ECMP path pinning on the leaf-spine rig. See docs/paths.md.

  ltp paths show [--name NAME] [-j]                flow -> spine, bytes per link, shared links
  ltp paths pin [--name NAME] [--policy pinned|ecmp] [-j]
  ltp paths down [--name NAME]                     remove a leaf-spine rig

`ltp rig up --topology leaf-spine` (tools/cmd_rig.py) builds the rig.
"""
from __future__ import annotations

from . import rigs
from .common import LtpError, add_command, add_json, emit, need_bcc, need_root
from .flags import add_rig_name

EPILOG = """examples:
  sudo ltp rig up --topology leaf-spine --name ls --jobs 2 --workers 2
  sudo ltp paths pin --name ls              assign spines, probe source ports, write pins
  sudo ltp paths show --name ls -j          where each job's bytes went
  sudo ltp paths pin --name ls --policy ecmp   remove the pins: plain ECMP again
  sudo ltp paths down --name ls
"""


def register(sub) -> None:
    p = add_command(sub, "paths", "leaf-spine rig: per-link counters and ECMP path pinning",
                    description="Assign each job's flows to spines so jobs do not share "
                    "leaf-spine links, and enforce it in the hosts' tc egress program.",
                    epilog=EPILOG)
    psub = p.add_subparsers(dest="paths_command", metavar="ACTION")
    sh = add_command(psub, "show", "flows -> spine, bytes per link, shared links flagged")
    add_rig_name(sh, "leaf-spine")
    add_json(sh)
    sh.set_defaults(func=cmd_show)
    pn = add_command(psub, "pin", "pin every job's flows to its assigned spine (or unpin)")
    add_rig_name(pn, "leaf-spine")
    pn.add_argument("--policy", choices=("pinned", "ecmp"), default="pinned",
                    help="pinned: control.pathplan.assign + probed source ports (default); "
                    "ecmp: remove the pins so the leaves' hash decides")
    add_json(pn)
    pn.set_defaults(func=cmd_pin)
    dn = add_command(psub, "down", "remove a leaf-spine rig (namespaces, tc, pins, state)")
    add_rig_name(dn, "leaf-spine")
    add_json(dn)
    dn.set_defaults(func=cmd_down)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


def _resolve(name: str | None) -> str:
    from ..dataplane.rig.leafspine import LeafSpine
    return rigs.choose(name, LeafSpine.names, "leaf-spine rig",
                       "no leaf-spine rig is up: `sudo ltp rig up --topology leaf-spine`")


def _attach(name: str | None):
    from ..dataplane.rig.leafspine import LeafSpine
    return LeafSpine.attach(_resolve(name))


def show(ls) -> dict:
    """What `ltp paths show` prints: rig, pins, observed flows, bytes per link."""
    from ..control import pathplan
    obs = pathplan.observe(ls)
    desc = ls.to_dict()
    tbf = {t["link"]: t for t in ls.tbf()}
    links = [{**lk, **{k: tbf.get(lk["link"], {}).get(k) for k in ("bytes", "packets", "drops")}}
             for lk in desc["links"]]
    return {"name": ls.name, "config": desc["config"], "routers": desc["routers"],
            "links": links, "jobs": desc["jobs"],
            "pins": ls.pins_now(), "policy": "pinned" if ls.pins_now() else "ecmp",
            "flows": obs["flows"], "link_bytes": obs["link_bytes"],
            "shared_links": obs["shared_links"],
            "shared_link_fraction": obs["shared_link_fraction"]}


def _show_text(d: dict) -> str:
    lines = [f"leaf-spine rig {d['name']}: policy {d['policy']}, "
             f"{len(d['jobs'])} jobs, {len(d['routers'])} routers"]
    if d["pins"]:
        lines.append("pins (saddr -> daddr:dport  sport  spine  packets):")
        lines += [f"  {p['saddr']:>15} -> {p['daddr']}:{p['dport']}  {p['sport']:>5}  "
                  f"{'-' if p['spine'] == 0xFFFF else p['spine']:>5}  {p['packets']}"
                  for p in d["pins"]]
    lines.append("flows seen (job  saddr:sport -> daddr  link  bytes):")
    lines += [f"  {f['job']:<4} {f['saddr']:>15}:{f['sport']:<5} -> {f['daddr']:<15} "
              f"{f['link']:<6} {f['bytes']}"
              for f in d["flows"]] or ["  (none yet)"]
    lines.append("bytes per link (BPF counters; tbf: bytes sent / drops):")
    tbf = {lk["link"]: lk for lk in d["links"]}
    for link, jobs in d["link_bytes"].items():
        flag = "  SHARED" if link in d["shared_links"] else ""
        t = tbf.get(link, {})
        lines.append(f"  {link:<6} " + (", ".join(f"{j}={v}" for j, v in jobs.items()) or "-")
                     + f"  [tbf {t.get('bytes')} / {t.get('drops')}]" + flag)
    return "\n".join(lines)


def cmd_show(args) -> None:
    need_root("ltp paths show")
    ls = _attach(args.name)
    try:
        emit(args, show(ls), _show_text)
    finally:
        ls.close()


def cmd_pin(args) -> None:
    need_root("ltp paths pin")
    need_bcc()
    from ..control import pathplan
    ls = _attach(args.name)
    try:
        if args.policy == "ecmp":
            ls.clear_pins()
            out = {"name": ls.name, "policy": "ecmp", "pins": []}
        else:
            a = pathplan.assign(ls.config.spines, pathplan.rig_flows(ls))
            pins = pathplan.pin(ls, a)
            ls.reset_link_counters()      # the probes are not traffic
            out = {"name": ls.name, "policy": "pinned", "assignment": a.to_dict(), "pins": pins}
    finally:
        ls.close()
    emit(args, out, lambda o: (f"{o['name']}: plain ECMP (no pins)" if o["policy"] == "ecmp" else
                               f"{o['name']}: {o['assignment']['regime']} assignment, job -> "
                               f"spines {o['assignment']['job_spines']}\n" + "\n".join(
                                   f"  {p['job']} {p['src']} -> {p['dst']}: sport {p['sport']}"
                                   f" -> spine {p['spine']}" for p in o["pins"])))


def cmd_down(args) -> None:
    need_root("ltp paths down")
    from ..dataplane.rig.leafspine import LeafSpine
    name = _resolve(args.name)
    if not LeafSpine.destroy(name):
        raise LtpError(f"no leaf-spine rig named {name!r}")
    emit(args, {"removed": name}, f"leaf-spine rig {name} removed")
