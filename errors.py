# SPDX-License-Identifier: Apache-2.0
"""The one error root of LTP and its branches.

Every failure the project reports on purpose is an `LtpError`: its message is
one line that names what was wrong and what to do next. The `ltp` command
turns any LtpError into that line (or a JSON object under -j) and exit code
`exit_code` (1, or 2 for a `UsageError`) in one place (tools/common.run).
They derive from RuntimeError so callers that caught that still do.

    LtpError
    ├── UsageError        bad flag, value or argument (exit 2)
    ├── DataplaneError    compiling, attaching, pinning, map access
    │   └── RegistryError what `ltp load` left (records, pins)
    ├── RigError          building, using or removing a namespace rig
    ├── TransportError    a round could not be completed as asked
    │   ├── DeadPeerError a push's target answered nothing by its timeout
    │   └── CommError     a training rank's push, pull or handshake failed
    ├── LaunchError       a rank of a launched job failed or timed out
    └── BenchError        a benchmark could not be set up or did not finish
"""
from __future__ import annotations

EXIT_ERROR, EXIT_USAGE = 1, 2


class LtpError(RuntimeError):
    """A failure to report in one line; `exit_code` is the command's status."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(LtpError):
    """Bad input from the user: a flag, a value, an argument."""

    exit_code = EXIT_USAGE


class DataplaneError(LtpError):
    """A load, attach, pin or map step failed; the message names the fix."""


class RegistryError(DataplaneError):
    """A record or pin of a loaded program is missing or unreadable."""


class RigError(LtpError):
    """A rig could not be built, used or removed."""


class TransportError(LtpError):
    """A round could not be completed as asked (e.g. reliable data timed out)."""


class DeadPeerError(TransportError):
    """A push's target answered nothing (no ACK, no CLOSED) to its last sends
    by the push's timeout: dead, unreachable, or not taking the round.
    `peers` names them; `report` is the push so far (a PushReport)."""

    def __init__(self, message: str, peers=(), report=None):
        super().__init__(message)
        self.peers, self.report = list(peers), report


class CommError(TransportError):
    """A training rank's transport step failed or timed out; names the peer."""


class LaunchError(LtpError):
    """A rank failed or the job timed out; the message names the rank and its log."""


class BenchError(LtpError):
    """A benchmark could not be set up or did not finish."""
