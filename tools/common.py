# SPDX-License-Identifier: Apache-2.0
"""Shared plumbing for `ltp` subcommands: parsers, errors, exit codes, JSON output,
plain tables (rich) and log lines.

Exit codes: 0 ok, 1 runtime error, 2 usage error (bad flag or value).
With -j/--json every result and every error is a JSON object on stdout.
"""
from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import sys
from typing import Any
from collections.abc import Callable

from ..errors import EXIT_ERROR, DataplaneError, LtpError, UsageError

EXIT_OK = 0


def add_command(sub, name: str, help: str, *, description: str | None = None,
                epilog: str | None = None) -> argparse.ArgumentParser:
    """A (sub)command's parser under `sub`; description and epilog keep their
    line breaks, so examples stay one a line."""
    return sub.add_parser(name, help=help, description=description, epilog=epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("-j", "--json", action="store_true", help="print JSON")
    p.add_argument("-p", "--pretty", action="store_true",
                   help="pretty-printed JSON (implies -j)")


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False) or getattr(args, "pretty", False))


def emit(args: argparse.Namespace, obj: Any, text: Callable[[Any], Any] | str | None = None) -> None:
    """Print `obj` as JSON under -j, else `text(obj)` (or `text`): a string,
    or a rich renderable (a table), drawn as wide as the terminal (80
    columns when the output is not one)."""
    if wants_json(args):
        print(json.dumps(obj, indent=2 if getattr(args, "pretty", False) else None,
                         default=_json_default))
    elif text is not None:
        out = text(obj) if callable(text) else text
        if isinstance(out, str):
            if out:
                print(out)
        elif out is not None:
            console().print(out)


def console(stderr: bool = False):
    """A rich Console for tables: no markup or highlighting in the data (a
    namespace called "[red]" stays that text), colour only on a terminal."""
    from rich.console import Console  # noqa: PLC0415 (the ltp command's start: only output that needs it)
    return Console(stderr=stderr, markup=False, highlight=False, emoji=False)


def table(columns: list[tuple[str, str, bool]], rows: list[list[str]], width: int | None = None,
          least: list[int] | None = None, **style):
    """A rich Table of plain columns (no box, one space apart) that fits
    `width` (default: the terminal's, 80 off a terminal). columns: (header,
    "left" or "right", may shrink); each is as wide as its widest cell in
    `rows` (at least `least[i]`). When that is too wide, the widest shrinkable
    column gives way first, its long cells ending in "…". The caller adds
    the rows (add_row), with styles if it wants."""
    width = width or console().width
    widths = [max([len(h), (least or [0] * len(columns))[i], *(len(r[i]) for r in rows)])
              for i, (h, _, _) in enumerate(columns)]
    while sum(widths) + len(widths) - 1 > width:
        can = [i for i, (h, _, shrink) in enumerate(columns) if shrink and widths[i] > len(h)]
        if not can:
            break
        widths[max(can, key=lambda i: widths[i])] -= 1
    t = _data_table()(box=None, pad_edge=False, padding=(0, 0, 0, 1), header_style="bold",
                      **style)
    for (header, justify, _), w in zip(columns, widths):
        t.add_column(header, justify=justify, no_wrap=True, overflow="ellipsis",
                     min_width=w, max_width=w)
    return t


@functools.cache
def _data_table():
    """rich's Table whose string cells are data: never read as markup, so a
    namespace called "[red]x" shows as that, whatever console draws it."""
    from rich.table import Table  # noqa: PLC0415 (the ltp command's start)
    from rich.text import Text  # noqa: PLC0415 (the ltp command's start)

    class DataTable(Table):
        def add_row(self, *cells, **kw) -> None:
            super().add_row(*(Text(c) if isinstance(c, str) else c for c in cells), **kw)
    return DataTable


def add_verbose(p: argparse.ArgumentParser) -> None:
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="log more on stderr (-vv: debug)")


def setup_logging(verbose: int, name: str) -> None:
    """Log lines on stderr, "ltp NAME: level: message": warnings always,
    info with -v, debug with -vv."""
    level = logging.WARNING if not verbose else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr,
                        format=f"ltp {name}: %(levelname)s: %(message)s")


def _json_default(o: Any) -> Any:
    try:
        import numpy as np  # noqa: PLC0415 (the ltp command's start: only what computes)
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def need_root(what: str) -> None:
    """Raise a one-line error naming the fix when not running as root."""
    if os.geteuid() != 0:
        raise LtpError(f"{what} needs root (CAP_BPF, CAP_NET_ADMIN): run it with sudo; "
                       "`ltp doctor --fix` checks the rest of the set-up")


def need_bcc() -> None:
    try:
        import bcc  # noqa: F401, PLC0415 (optional: this checks it is there)
    except ImportError:
        raise LtpError("bcc is not importable: install Debian's python3-bpfcc and use a venv "
                       "made with --system-site-packages (`ltp doctor --fix` names the steps)") from None


def parse_size(text: str, what: str) -> int:
    """'256KiB', '30kb', '1M', '1500' -> bytes. kb/KB = 1000, KiB = 1024."""
    units = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 10**6, "mb": 10**6,
             "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30}
    return _parse_unit(text, units, what, "1500, 30kb, 256KiB, 4MiB")


def parse_rate(text: str, what: str = "--rate") -> int:
    """'1gbit', '100mbit', '500kbit', '1e9' -> bits per second."""
    units = {"": 1, "bit": 1, "bps": 1, "kbit": 1000, "k": 1000, "mbit": 10**6, "m": 10**6,
             "gbit": 10**9, "g": 10**9}
    return _parse_unit(text, units, what, "100mbit, 1gbit, 500kbit, 1e9")


def _parse_unit(text: str, units: dict[str, int], what: str, examples: str) -> int:
    s = text.strip().lower()
    i = len(s)
    while i > 0 and s[i - 1].isalpha():
        i -= 1
    num, unit = s[:i], s[i:]
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if unit not in units or not 0 < value < math.inf:   # also nan, inf and 1e400
        raise UsageError(f"{what}: cannot read {text!r} (a number with a unit, e.g. {examples}; "
                         f"units: {', '.join(k for k in units if k)})")
    return int(round(value * units[unit]))


def run(func: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    """Run a subcommand, turning errors into one line (or JSON) and an exit code."""
    try:
        rc = func(args)
        return EXIT_OK if rc is None else rc
    except LtpError as e:
        msg = str(e) or type(e).__name__
        if isinstance(e, DataplaneError):  # a compiler's log follows its first line
            msg = msg.splitlines()[0][:400]
        _report(args, msg, e.exit_code)
        return e.exit_code
    except KeyboardInterrupt:
        _report(args, "interrupted", EXIT_ERROR)
        return 130
    except BrokenPipeError:
        # the reader went away (`ltp ... | head`): stop quietly, as coreutils
        # do; stdout is pointed at /dev/null so the interpreter's final flush
        # does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    except PermissionError as e:
        _report(args, f"permission denied: {e}; run as root (sudo) and see `ltp doctor`", EXIT_ERROR)
        return EXIT_ERROR


def _report(args: argparse.Namespace, message: str, code: int) -> None:
    if wants_json(args):
        print(json.dumps({"error": message, "exit_code": code}))
    else:
        print(f"ltp: error: {message}", file=sys.stderr)
