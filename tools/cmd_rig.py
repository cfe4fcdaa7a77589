# SPDX-License-Identifier: Apache-2.0
"""`ltp rig`: the network-namespace test rig (switch, PS, workers, TBF
bottleneck, loss injector). See docs/rig.md. This module builds, shows, uses
and removes rigs; the measurements on a rig (check, incast-tcp) are in
cmd_rig_measure.py, registered here under the same `ltp rig`.

  ltp rig up [--name NAME] [--workers N] [--servers S] [--nodes K [--colocate]]
             [--rate 1gbit] [--buffer 30kb] [--loss P] [--shape ps|all] [--mode native|skb]
  ltp rig status [--name NAME] [-j]
  ltp rig exec [--name NAME] HOST -- CMD...
  ltp rig down [--name NAME | --all]
  ltp rig check [--workers N] [--rate R] [--loss P] [-j]
  ltp rig incast-tcp [--workers 16] [--rate 1gbit] [--buffer 30kb] [--cc cubic|bbr]
                     [--size 256KiB] [--rounds 20] [--name NAME] [-j]
"""
from __future__ import annotations

import argparse
import json
import subprocess

from . import cmd_rig_measure, rigs
from .common import LtpError, UsageError, add_command, add_json, emit, need_root, wants_json
from .flags import (add_loss, add_rig_name, add_shape, add_switch_mode, check_bytes, check_name,
                    check_rate)

RIG_EPILOG = """examples:
  sudo ltp rig up --workers 8 --rate 1gbit --buffer 30kb --loss 0.01
  sudo ltp rig up --workers 8 --servers 2   two server hosts, ps and ps1 (sharded training)
  sudo ltp rig up --workers 8 --nodes 4     4 nodes of 2 workers, each node one shaped link
  sudo ltp rig up --workers 4 --servers 4 --nodes 4 --colocate   a server beside each worker
  ltp rig status -j
  ltp rig exec w0 -- ip -br addr
  ltp rig exec ps -- python3 -c 'print(1)'
  ltp rig down                 (or: ltp rig down --all)
  ltp rig check -j             measure the achieved rate and drop fraction
  ltp rig incast-tcp -j        TCP incast: 16 workers x 256 KiB into 1 Gbit, 30 KB buffer

Hosts are "ps" and "w0".."wN-1" (namespaces ltp-<name>-ps, ltp-<name>-w3, switch
ltp-<name>-sw); the PS is 198.18.0.1, worker i is 198.18.0.(10+i), all in 198.18.0.0/24
with no route out. The loss injector drops only IPv4 UDP/TCP (never ARP or ICMP).
With --servers S, server i ("ps<i>", 198.18.<i>.1) has a subnet and bridge of its own
and every worker a device on it (ltp-w<j>s<i>, 198.18.<i>.(10+j)): --shape ps shapes
every server's port. With --nodes K the workers (and with --colocate server i beside
worker i) are grouped into K nodes: every host keeps its own device, and a node's
devices share one link shaped to --rate each way, as ranks on one NIC do.
"""


def register(sub) -> None:
    p = add_command(sub, "rig", "netns test rig: switch, PS, workers, bottleneck, loss",
                    description="Build and use a network-namespace rig: a bridge (the switch), "
                    "a parameter server and N workers, TBF on the port toward the PS and a "
                    "tc BPF loss injector.", epilog=RIG_EPILOG)
    rsub = p.add_subparsers(dest="rig_command", metavar="ACTION")

    def action(name: str, help: str, epilog: str) -> argparse.ArgumentParser:
        return add_command(rsub, name, help, description=help, epilog="examples:\n" + epilog)

    _register_up(action)
    _register_use(action)
    cmd_rig_measure.register(action)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


def _register_up(action) -> None:
    up = action("up", "build a rig that stays until `ltp rig down`",
                "  sudo ltp rig up --workers 32\n"
                "  sudo ltp rig up --name b --workers 4 --rate 100mbit --buffer 64kb --loss 0.02\n"
                "  sudo ltp rig up --shape all --mode skb\n")
    add_rig_name(up, "new")
    add_shape(up, workers=4)
    up.add_argument("--servers", type=int, default=1,
                    help="server hosts, 1..8 (default 1): each on its own subnet and switch "
                    "port (shaped and lossy like the PS's), every worker with a device on each "
                    "(sharded training: ltp launch/train --servers)")
    up.add_argument("--topology", choices=("star", "leaf-spine"), default="star",
                    help="star: one switch (default); leaf-spine: leaf and spine routers, "
                    "jobs' hosts on the leaves, every leaf-spine link shaped to --rate "
                    "(--workers is then per job; see docs/paths.md and `ltp paths`)")
    up.add_argument("--leaves", type=int, default=2, help="leaf-spine: leaves (default 2)")
    up.add_argument("--spines", type=int, default=2, help="leaf-spine: spines (default 2)")
    up.add_argument("--jobs", type=int, default=2, help="leaf-spine: jobs, each a PS on leaf 0 "
                    "and workers on the other leaves (default 2)")
    up.add_argument("--nodes", type=int, default=0, metavar="K",
                    help="group the workers into K nodes of workers/K, each node's devices "
                    "sharing one link shaped to --rate each way (default 0: a link per host; "
                    "implies --shape all)")
    up.add_argument("--colocate", action="store_true",
                    help="with --nodes and --servers = --workers: server i on worker i's node")
    add_loss(up)
    up.add_argument("--loss-on", choices=("ps", "all"), default="ps",
                    help="ports with the loss injector: toward the PS only, or every port")
    up.add_argument("--shape", choices=("ps", "all"), default=None,
                    help="TBF on the port toward the PS only (default without --nodes), or on "
                    "every port")
    add_switch_mode(up)
    add_json(up)
    up.set_defaults(func=cmd_up)


def _register_use(action) -> None:
    st = action("status", "show a rig: hosts, bottleneck, loss-injector counters",
                "  ltp rig status\n  ltp rig status --name b -j\n")
    add_rig_name(st)
    add_json(st)
    st.set_defaults(func=cmd_status)

    ex = action("exec", "run a command inside a host's namespace",
                "  ltp rig exec w0 -- ip -br addr\n  ltp rig exec --name b ps -- ss -tn\n")
    add_rig_name(ex)
    add_json(ex)
    ex.add_argument("host", help='"ps", "w<i>", a namespace name or an address')
    ex.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command")
    ex.set_defaults(func=cmd_exec)

    dn = action("down", "remove a rig (or every rig)",
                "  ltp rig down\n  ltp rig down --name b\n  ltp rig down --all\n"
                "  ltp rig down --all --force\n")
    g = dn.add_mutually_exclusive_group()
    add_rig_name(g)
    g.add_argument("--all", action="store_true",
                   help="remove every rig on this machine, except rigs a live process is "
                   "building or using in a `with Rig(...)` block (another test run)")
    dn.add_argument("--force", action="store_true",
                    help="with --all: remove those in-use rigs too")
    add_json(dn)
    dn.set_defaults(func=cmd_down)


# --------------------------------------------------------------------------- up

def cmd_up(args) -> int | None:
    if getattr(args, "topology", "star") == "leaf-spine":
        if getattr(args, "servers", 1) != 1:
            raise UsageError("--servers: the leaf-spine rig has one PS per job; several "
                             "servers per job are built on the star rig only (for now)")
        if getattr(args, "nodes", 0) or getattr(args, "colocate", False):
            raise UsageError("--nodes/--colocate: nodes are built on the star rig only")
        return _up_leaf_spine(args)
    nodes = getattr(args, "nodes", 0)
    cfg = rigs.star_config(name=check_name(args.name), **rigs.shaped(args),
                           shape=args.shape or ("all" if nodes else "ps"),
                           loss_on=args.loss_on, mode=args.mode,
                           servers=getattr(args, "servers", 1), nodes=nodes,
                           colocate=getattr(args, "colocate", False))
    rigs.prepare()
    from ..dataplane.rig.star import Rig
    emit(args, _bring_up(Rig(cfg)), _up_text)


def _up_leaf_spine(args) -> None:
    """`ltp rig up --topology leaf-spine`: the rig `ltp paths` works on."""
    from ..dataplane.rig.leafspine import LeafSpine, LeafSpineConfig
    cfg = rigs.config(LeafSpineConfig, name=args.name, leaves=args.leaves, spines=args.spines,
                      jobs=args.jobs, workers=args.workers, mode=args.mode,
                      rate_bps=check_rate(args.rate),
                      buffer_bytes=check_bytes(args.buffer, "--buffer"),
                      burst_bytes=check_bytes(args.burst, "--burst"))
    rigs.prepare("ltp rig up")
    emit(args, _bring_up(LeafSpine(cfg)), lambda s: (
        f"leaf-spine rig {s['name']} is up: {cfg.leaves} leaves, {cfg.spines} spines, "
        f"{cfg.jobs} jobs x {cfg.workers} workers; links {cfg.rate_bps / 1e6:g} Mbit/s\n"
        + "\n".join(f"  job {j['job']}: PS {j['ps']}, workers {', '.join(j['workers'])}"
                    for j in s["jobs"])
        + f"\nnext: ltp paths pin --name {s['name']} | ltp paths show --name {s['name']}"
          f" | ltp paths down --name {s['name']}"))


def _bring_up(rig) -> dict:
    """Build a rig that stays (star or leaf-spine) and return its status."""
    try:
        rig.up()
        return rig.status()
    finally:
        rig.close()


def _up_text(s: dict) -> str:
    c = s["config"]
    ps = [h for h in s["hosts"] if h["role"] == "ps"]
    ws = [h for h in s["hosts"] if h["role"] == "worker"]
    return (f"rig {s['name']} is up: PS {', '.join(h['ip'] for h in ps)} "
            f"({', '.join(h['netns'] for h in ps)}), "
            f"{c['workers']} workers {ws[0]['ip']}..{ws[-1]['ip']} "
            f"({ws[0]['netns']}..{ws[-1]['name']})"
            + "".join(f"\n  node {k}: {', '.join(n)} (one link)" for k, n in
                      enumerate(s.get("nodes") or [])) + "\n"
            f"bottleneck {rigs.fmt_rate(c['rate_bps'])}, buffer {c['buffer_bytes']} B, burst "
            f"{c['burst_bytes']} B on {', '.join(s['shaped_ports'])}; loss {c['loss']:g} on "
            f"{', '.join(s['loss_ports'])}; mode {c['mode']}\n"
            f"next: ltp rig status --name {s['name']} | ltp rig exec --name {s['name']} w0 -- CMD"
            f" | ltp rig down --name {s['name']}")


# --------------------------------------------------------------------------- status

def cmd_status(args) -> int | None:
    name = check_name(args.name)
    need_root("ltp rig status")
    from ..dataplane.rig.leafspine import LeafSpine
    from ..dataplane.rig.star import Rig
    if not name and not Rig.names() and not LeafSpine.names():   # nothing to show: no error
        emit(args, {"rigs": []}, lambda _: "no rig is up (`sudo ltp rig up` builds one)")
        return None
    if name and LeafSpine.exists(name):  # a leaf-spine rig of that name
        ls = LeafSpine.attach(name)
        try:
            emit(args, ls.status(), lambda st: json.dumps(st, indent=2, default=str))
        finally:
            ls.close()
        return None
    rig = rigs.attach(name)
    try:
        st = rig.status()
    finally:
        rig.close()
    emit(args, st, _status_text)


def _status_text(s: dict) -> str:
    import datetime
    c = s["config"]
    when = (datetime.datetime.fromtimestamp(s["created"]).strftime("%Y-%m-%d %H:%M:%S")
            if s.get("created") else "?")
    servers = c.get("servers", 1)
    lines = [f"rig {s['name']}: {c['workers']} workers, "
             + (f"{servers} servers (subnets 198.18.0-{servers - 1}.0/24), " if servers > 1
                else "")
             + f"mode {c['mode']}, subnet {s['subnet']}, switch {s['switch_ns']} "
             f"({', '.join(s.get('bridges') or [s['bridge']])}), up since {when}"
             + ("" if s.get("namespaces_present") else "  [INCOMPLETE: namespaces missing]")]
    lines += _bottleneck_lines(s.get("bottleneck"))
    li = s.get("loss_injector", {})
    if "error" in li:
        lines.append(f"loss injector: error: {li['error']}")
    else:
        meas = "-" if li.get("measured") is None else f"{li['measured']:.4f}"
        lines.append(f"loss injector on {', '.join(li['ports'])}: p={li['loss']:.4f}; dropped "
                     f"{li['dropped']}, passed {li['passed']} (measured {meas}), not judged "
                     f"(ARP, ICMP, ...) {li['other']}")
    w = max(len(h["netns"]) for h in s["hosts"])
    lines.append(f"{'HOST':5} {'ROLE':6} {'NAMESPACE':{w}} {'ADDRESS':16} {'IFNAME':8} MAC")
    for h in s["hosts"]:
        lines.append(f"{h['name']:5} {h['role']:6} {h['netns']:{w}} "
                     f"{h['ip'] + '/' + str(h['prefixlen']):16} {h['ifname']:8} {h['mac']}")
    lines += [f"node {k}: {', '.join(n)} (one link: n{k}-down, n{k}-up)"
              for k, n in enumerate(s.get("nodes") or [])]
    return "\n".join(lines)


def _bottleneck_lines(bn) -> list[str]:
    if isinstance(bn, dict):
        return [f"bottleneck: error: {bn.get('error')}"]
    lines = []
    for q in bn:
        state = (f"sent {q.get('packets', 0)} pkts / {q.get('bytes', 0)} B, dropped "
                 f"{q.get('drops', 0)}, overlimits {q.get('overlimits', 0)}, backlog "
                 f"{q.get('backlog', 0)} B" if q["present"] else "TBF MISSING")
        lines.append(f"bottleneck {q['port']}: TBF {rigs.fmt_rate(q['rate_bps'])}, buffer "
                     f"{q['buffer_bytes']} B, burst {q['burst_bytes']} B; {state}")
    return lines


# --------------------------------------------------------------------------- exec, down

def cmd_exec(args) -> int:
    name = check_name(args.name)
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("exec: give a command after --, e.g. `ltp rig exec w0 -- ip -br addr`")
    need_root("ltp rig exec")
    rig = rigs.attach(name)
    try:
        host = rig.host(args.host)
    except KeyError as e:
        raise UsageError(f"HOST: {e.args[0]}") from None
    try:
        if wants_json(args):
            r = rig.exec(host, cmd)
            emit(args, {"host": host.name, "netns": host.netns, "argv": cmd,
                        "returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr})
            return r.returncode
        return subprocess.call(rig.argv(host, cmd))
    except FileNotFoundError as e:
        raise LtpError(f"cannot run: {e}") from None


def cmd_down(args) -> int | None:
    name = check_name(args.name)
    need_root("ltp rig down")
    from ..dataplane.rig.star import Rig
    if args.force and not args.all:
        raise UsageError("--force: only with --all")
    skipped: list[dict] = []
    if args.all:
        before = Rig.names()
        removed = Rig.down_all(force=args.force)
        skipped = [{"name": n, "owner_pid": Rig.owner(n)} for n in before if n not in removed]
    else:
        from ..dataplane.rig.leafspine import LeafSpine
        if name and LeafSpine.exists(name):
            LeafSpine.destroy(name)
            emit(args, {"removed": [name], "skipped": []}, f"removed {name}")
            return None
        target = rigs.resolve(name)
        if not Rig.destroy(target):
            raise LtpError(f"no rig named {target!r} (rigs: {', '.join(Rig.names()) or 'none'})")
        removed = [target]

    def text(d: dict) -> str:
        out = f"removed {', '.join(d['removed'])}" if d["removed"] else "no rig to remove"
        for k in d["skipped"]:
            out += (f"\nkept {k['name']}: in use by process {k['owner_pid']} "
                    "(--all --force removes it)")
        return out
    emit(args, {"removed": removed, "skipped": skipped}, text)
