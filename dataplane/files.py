# SPDX-License-Identifier: Apache-2.0
"""Files that may hold tokens, models or a job's timings: made 0600, never through a symlink.

A capture holds the frames' tokens, a checkpoint the model, a trace and a
flight dump what the job did; a process's umask would leave them readable
by others, and a plain open() follows a symlink an attacker planted where
the file is to be. `create` makes a new file (O_EXCL: a temporary one, to
be renamed over the real name) or truncates the one named (O_TRUNC: a
capture an operator names), mode 0600 when it is new, O_NOFOLLOW either
way. Importing this module needs nothing but the standard library.
"""
from __future__ import annotations

import contextlib
import os

PRIVATE = 0o600


def create(path: str, binary: bool = True, *, replace: bool = False, **kw):
    """A new file at `path` (an open file object; keywords go to os.fdopen),
    mode 0600, never a symlink's target. replace=False: `path` must not be
    there, except a leftover of this process's own (a temporary name of
    ours: it is removed first); replace=True: a file already there is
    truncated (its mode kept), a symlink refused (OSError ELOOP)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    flags |= os.O_TRUNC if replace else os.O_EXCL
    try:
        fd = os.open(path, flags, PRIVATE)
    except FileExistsError:
        if replace:
            raise
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)              # unlink removes a symlink itself, never its target
        fd = os.open(path, flags, PRIVATE)
    return os.fdopen(fd, "wb" if binary else "w", **kw)
