# SPDX-License-Identifier: Apache-2.0
"""`ltp key`: make a worker's member key file from the job key (control/trust/jobkey.py).

  ltp key member --worker W [--servers S] [--downlink unicast] JOBKEYFILE [-o OUT]

On real hosts the operator makes the job key once (`openssl rand -hex 32`)
and gives it to the server ranks only; each worker gets a member key file
of its own, which holds its keys and not the job key (docs/deploy.md).
"""
from __future__ import annotations

import os

from .common import UsageError, add_command

EPILOG = """examples:
  (umask 077; openssl rand -hex 32 > job.key)          the job key: server ranks only
  ltp key member --worker 0 job.key -o w0.key          worker 0's file (mode 0600)
  ltp key member --worker 3 --servers 2 job.key -o w3.key
      (a job of 2 server ranks: the file holds worker 3's keys for both)
  ltp key member --worker 1 --downlink unicast job.key -o w1.key
      (no group key: the job runs --downlink unicast, and no member can
      forge a group answer)
  (umask 077; ltp key member --worker 2 job.key > w2.key)
Each rank then reads its own file through LTP_SECRET_FILE.
"""


def register(sub) -> None:
    p = add_command(sub, "key", "make a worker's member key file from the job key",
                    description="Per-rank key files: server ranks read the job key, each "
                    "worker a member key file of its own (its flow tokens' keys, the group "
                    "key for the group downlink, the store's MAC key, its TCP hello), from "
                    "which neither the job key nor another worker's keys follow.",
                    epilog=EPILOG)
    psub = p.add_subparsers(dest="key_command", metavar="ACTION")
    m = add_command(psub, "member", "write worker W's member key file",
                    description="Worker W's member key file, from the job key file (hex, "
                    "mode 0600). Printed to stdout, or written to -o OUT (a new file, mode "
                    "0600).", epilog=EPILOG)
    m.add_argument("--worker", "-w", type=_worker, required=True, metavar="W",
                   help="the worker's id: its rank among the workers (0..)")
    m.add_argument("--servers", type=_servers, default=1, metavar="S",
                   help="the job's server ranks (--servers of ltp launch; default 1)")
    m.add_argument("--downlink", choices=("group", "unicast"), default="group",
                   help="the job's downlink: group (default) puts the group key in the "
                   "file, unicast leaves it out")
    m.add_argument("-o", "--out", metavar="OUT", help="write a new file OUT (mode 0600) "
                   "instead of stdout")
    m.add_argument("jobkey", metavar="JOBKEYFILE", help="the job key file (hex, mode 0600)")
    m.set_defaults(func=cmd_member)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


def _worker(text: str) -> int:
    return _int_in(text, 0, 2**16 - 1, "a worker id")


def _servers(text: str) -> int:
    return _int_in(text, 1, 64, "a server count")


def _int_in(text: str, lo: int, hi: int, what: str) -> int:
    import argparse  # noqa: PLC0415 (only for a bad value)
    try:
        v = int(text)
    except ValueError:
        v = None
    if v is None or not lo <= v <= hi:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what} ({lo}..{hi})")
    return v


def cmd_member(args) -> int:
    from ..control.trust import jobkey  # noqa: PLC0415 (the command's start stays light)
    key = jobkey.read_key_file(args.jobkey, "JOBKEYFILE")
    if isinstance(key, jobkey.MemberKeys):
        raise UsageError(f"{args.jobkey} is worker {key.worker}'s member key file: give the "
                         "job key file (hex)")
    text = jobkey.member_text(jobkey.member_keys(key, args.worker, args.servers,
                                                 args.downlink == "group"))
    if not args.out:
        print(text, end="")
        return 0
    try:
        jobkey.write_private(args.out, text)
    except FileExistsError:
        raise UsageError(f"-o {args.out}: the file exists; remove it or name another") \
            from None
    except OSError as e:
        raise UsageError(f"-o {args.out}: cannot write it: {e.strerror}") from None
    os.chmod(args.out, 0o600)
    return 0
