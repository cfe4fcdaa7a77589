# SPDX-License-Identifier: Apache-2.0
"""The `ltp` command: one entry point, one module per subcommand group.

Each tools/cmd_*.py module has `register(subparsers)`, which adds its parser
and sets `func`. Errors become one line and an exit code (tools/common.py).
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import json
import re
import sys

from .. import __version__
from ..errors import EXIT_USAGE
from .common import run

# Subcommand modules, in help order.
COMMANDS = ["cmd_demo", "cmd_train", "cmd_launch", "cmd_doctor", "cmd_ops", "cmd_flows", "cmd_capture",
            "cmd_exporter", "cmd_bench", "cmd_rig", "cmd_paths", "cmd_trace", "cmd_key"]

EPILOG = """examples:
  ltp doctor --fix          check (and repair) root, bcc, headers, bpffs
  ltp demo                  push one tensor through the XDP program on a veth pair
  ltp bench xdp -j          ns per packet: XDP path vs a Python socket loop
  ltp rig up --workers 8    build a netns incast rig
  ltp --version             the version of this ltp
"""


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as JSON too when -j was given, with
    "did you mean" for a mistyped flag, subcommand or choice, and a flag the
    subcommand does not know reported by the subcommand (its usage, its flags)."""

    parsing: list[_Parser] = []    # the parsers of this command line, outermost first
    argv: list[str] = []           # the command line being parsed (main's argv)

    def parse_known_args(self, args=None, namespace=None):
        _Parser.parsing.append(self)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):  # noqa: D401
        inner = _Parser.parsing[-1] if _Parser.parsing else self
        if message.startswith("unrecognized arguments:"):
            known = [s for s in inner._option_string_actions if s.startswith("--")]
            self = inner
            message += _did_you_mean(message.split(":", 1)[1].split(), known)
        elif m := re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message):
            message += _did_you_mean([m.group(1)], re.findall(r"'([^']*)'", m.group(2)))
        if {"-j", "--json", "-p"} & set(_Parser.argv):
            print(json.dumps({"error": f"{self.prog}: {message}", "exit_code": EXIT_USAGE}))
            sys.exit(EXIT_USAGE)
        argparse.ArgumentParser.error(self, message)


def _did_you_mean(words: list[str], known: list[str]) -> str:
    """" (did you mean --workers?)" for the first of `words` close to one of `known`."""
    for w in words:
        close = difflib.get_close_matches(w.split("=", 1)[0], known, n=1, cutoff=0.6)
        if close:
            return f" (did you mean {close[0]}?)"
    return ""


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ltp", description="LTP: loss-tolerant gradient transport with an XDP "
                "receive path.", epilog=EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"ltp {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as e:
            if e.name and e.name.endswith(name):
                continue  # command not built yet in this tree
            raise
        mod.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    _Parser.parsing.clear()
    _Parser.argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = p.parse_args(argv)
    except SystemExit as e:     # --help, --version, or a usage error argparse reported
        return e.code
    if not getattr(args, "func", None):
        p.print_help()
        return EXIT_USAGE
    return run(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
