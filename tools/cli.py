"""The `ltp` command: one entry point, one module per subcommand group.

Each tools/cmd_*.py module has `register(subparsers)`, which adds its parser
and sets `func`. Errors become one line and an exit code (tools/common.py).
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

from .. import __version__
from ..errors import EXIT_USAGE
from .common import run

# Subcommand modules, in help order.
COMMANDS = ["cmd_demo", "cmd_train", "cmd_launch", "cmd_doctor", "cmd_ops", "cmd_flows", "cmd_capture",
            "cmd_exporter", "cmd_bench", "cmd_rig", "cmd_paths"]

EPILOG = """examples:
  ltp doctor --fix          check (and repair) root, bcc, headers, bpffs
  ltp demo                  push one tensor through the XDP program on a veth pair
  ltp bench xdp -j          ns per packet: XDP path vs a Python socket loop
  ltp rig up --workers 8    build a netns incast rig
  ltp --version             the version of this ltp
"""


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as JSON too when -j was given."""

    def error(self, message: str):  # noqa: D401
        if "-j" in sys.argv or "--json" in sys.argv or "-p" in sys.argv:
            print(json.dumps({"error": f"{self.prog}: {message}", "exit_code": EXIT_USAGE}))
            sys.exit(EXIT_USAGE)
        super().error(message)


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
    args = p.parse_args(argv)
    if not getattr(args, "func", None):
        p.print_help()
        return EXIT_USAGE
    return run(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
