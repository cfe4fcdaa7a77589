# SPDX-License-Identifier: Apache-2.0
"""`ltp trace`: read a job's trace file (`ltp train --trace FILE.json`,
`lt.init(trace=...)`): who the rounds waited for. See docs/slow-or-stuck.md.

  ltp trace summary FILE [-j]     per worker: rounds named straggler, lateness p50/p99
  ltp trace check FILE [-j]       is it a well-formed trace-event file?
  ltp trace merge A B -o OUT [--offset-us US] [-j]
                                  B's events beside A's (a torch.profiler trace of the run)
  ltp trace plot FILE -o OUT.png [--window A:B] [-j]
                                  the timeline as a picture (no browser needed)
"""
from __future__ import annotations

import json

from . import traceview
from .common import UsageError, add_command, add_json, emit

EPILOG = """examples:
  sudo ltp train --workers 4 --iterations 50 --straggler 2:100 --trace /tmp/t.json
  ltp trace summary /tmp/t.json
  ltp trace check /tmp/t.json -j
  ltp trace merge /tmp/t.json /tmp/torch_profile.json -o /tmp/both.json
      (B's times put on A's clock through the wall clock: torch.profiler's
      baseTimeNanoseconds; --offset-us US to give the shift yourself)
  ltp trace plot /tmp/t.json -o /tmp/t.png --window 1:2
      (the timeline from 1 s to 2 s after its first event, as a PNG)
Open the file in Perfetto (ui.perfetto.dev: Open trace file) or chrome://tracing.
"""


def register(sub) -> None:
    p = add_command(sub, "trace", "read a job's trace file: who the rounds waited for",
                    description="Per worker, from a Chrome trace-event file a job wrote "
                    "(ltp train --trace, lt.init(trace=...)): the rounds that named it "
                    "straggler and its lateness at the server's NIC.", epilog=EPILOG)
    psub = p.add_subparsers(dest="trace_command", metavar="ACTION")
    sm = add_command(psub, "summary", "per worker: rounds named straggler, lateness p50/p99")
    sm.add_argument("file", metavar="FILE")
    add_json(sm)
    sm.set_defaults(func=cmd_summary)
    ck = add_command(psub, "check", "check the file against the trace-event format")
    ck.add_argument("file", metavar="FILE")
    add_json(ck)
    ck.set_defaults(func=cmd_check)
    mg = add_command(psub, "merge", "put trace B's events beside trace A's (one file)",
                     description="Merge two trace-event files of one run: an LTP trace (A) "
                     "and, e.g., a torch.profiler export_chrome_trace file (B), B's "
                     "timestamps moved onto A's clock.")
    mg.add_argument("a", metavar="A")
    mg.add_argument("b", metavar="B")
    mg.add_argument("-o", "--out", required=True, metavar="OUT", help="the merged file")
    mg.add_argument("--offset-us", type=float, default=None, metavar="US",
                    help="add US microseconds to B's timestamps (default: through the wall "
                    "clock when B is a torch.profiler trace, else 0)")
    add_json(mg)
    mg.set_defaults(func=cmd_merge)
    pl = add_command(psub, "plot", "draw the timeline as a PNG (one row per track)",
                     description="One row per track (server rounds and answers, the NIC's "
                     "view of each worker, each worker's barrier, pushes and answers), "
                     "slices as bars by category, instants as ticks.")
    pl.add_argument("file", metavar="FILE")
    pl.add_argument("-o", "--out", required=True, metavar="OUT.png", help="the picture")
    pl.add_argument("--window", type=_window, default=(None, None), metavar="A:B",
                    help="seconds from the first event: A:B, A: or :B (default: all)")
    add_json(pl)
    pl.set_defaults(func=cmd_plot)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


def _window(text: str) -> tuple[float | None, float | None]:
    import argparse  # noqa: PLC0415 (only for a bad --window)
    lo, sep, hi = text.partition(":")
    try:
        if not sep:
            raise ValueError
        pair = (float(lo) if lo else None, float(hi) if hi else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not A:B seconds (1:2, 3:, :0.5)") \
            from None
    if any(v is not None and not (v >= 0 and v < float("inf")) for v in pair):
        raise argparse.ArgumentTypeError(f"{text!r}: seconds must be finite and >= 0")
    return pair


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read trace {path}: {e}") from None
    if not isinstance(d, dict) or "traceEvents" not in d:
        raise UsageError(f"{path} is not a trace-event file (no traceEvents)")
    return d


def _text(s: dict) -> str:
    lines = [f"{len(s['steps'])} steps ({s['rounds']} rounds), {s['rounds_attributed']} "
             f"attributed to a straggler ({s['attributed_by']['steady']} by the steady rule, "
             f"{s['attributed_by']['barrier']} by the barrier, "
             f"{s['attributed_by']['nic']} by the NIC; {s['steps_aside']} set aside)",
             f"{'worker':>8} {'straggler':>10} {'NIC rounds':>11} {'lateness p50':>13} {'p99':>9}"]
    for w, v in s["workers"].items():
        p50, p99 = v["lateness_p50_ms"], v["lateness_p99_ms"]
        lines.append(f"{w:>8} {v['straggler_steps']:>10} {v['nic_rounds']:>11} "
                     f"{'-' if p50 is None else f'{p50:.2f} ms':>13} "
                     f"{'-' if p99 is None else f'{p99:.2f} ms':>9}")
    return "\n".join(lines)


def summary(trace: dict) -> dict:
    """Per worker: the steps named it straggler (the barrier's last arriver
    beyond the margin, else the NIC's: as `ltp train -j`), the rounds the
    server's NIC named it in, its NIC lateness p50/p99."""
    from ..control.torchapi.trace import summarize  # noqa: PLC0415 (numpy: not for --help)
    from ..control.training.straggler_report import attribute_steps  # noqa: PLC0415 (as above)
    s = summarize(trace)
    step_s = (trace.get("otherData") or {}).get("step_s") or s["step_s"]   # the run's, if it said
    att = attribute_steps(s["notes"], s["nic"], len(s["steps"]), step_s, keys=s["steps"],
                         nic_late=s["nic_late"])
    for w, v in s["workers"].items():
        v["straggler_steps"] = att["straggler_rounds"].get(w, 0)
    return {"rounds": s["rounds"], "steps": s["steps"], **att, "workers": s["workers"]}


def cmd_summary(a) -> int:
    emit(a, summary(_load(a.file)), _text)
    return 0


def cmd_merge(a) -> int:
    import math  # noqa: PLC0415
    from ..control.torchapi.trace import merge, write  # noqa: PLC0415 (numpy: not for --help)
    if a.offset_us is not None and not math.isfinite(a.offset_us):
        raise UsageError(f"--offset-us: a finite number of microseconds, got {a.offset_us}")
    t, off, how = merge(_load(a.a), _load(a.b), a.offset_us)
    try:
        write(a.out, t)
    except OSError as e:
        raise UsageError(f"-o: cannot write {a.out}: {e}") from None
    emit(a, {"out": a.out, "events": len(t["traceEvents"]), "offset_us": off, "how": how},
         lambda r: f"{r['out']}: {r['events']} events; B shifted by {r['offset_us']:.1f} us "
         f"({r['how']})")
    return 0


def cmd_check(a) -> int:
    from ..control.torchapi.trace import problems  # noqa: PLC0415 (numpy: not for --help)
    d = _load(a.file)
    bad = problems(d)
    emit(a, {"file": a.file, "events": len(d["traceEvents"]), "ok": not bad, "problems": bad},
         lambda r: f"{r['file']}: {r['events']} events, "
         + ("well-formed" if r["ok"] else "\n  ".join(["problems:", *r["problems"]])))
    return 0 if not bad else 1


def cmd_plot(a) -> int:
    if not a.out.endswith(".png"):
        raise UsageError(f"-o: {a.out}: the picture is a PNG (name it .png)")
    try:
        r = traceview.plot(_load(a.file), a.out, *a.window)
    except OSError as e:
        raise UsageError(f"-o: cannot write {a.out}: {e}") from None
    emit(a, r, lambda r: f"{r['out']}: {r['tracks']} tracks, {r['slices']} slices, "
         f"{r['instants']} instants over {r['span_ms']:.0f} ms")
    return 0
