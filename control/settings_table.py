# SPDX-License-Identifier: Apache-2.0
"""A rank's settings, each declared once: name, type, default, bounds or
choices, help, environment variable, and the surfaces that carry it.

Generated from this table: ltpx.torch's `Settings` (lt.init()'s keywords and
the LTP_* variables it reads, torchapi/settings.py), the flags of one rank
(`python -m ltpx.control.training`), of `ltp train` and of `ltp launch`
(`add_flag`), and the LTP_* part of each rank's environment the launcher
builds (`to_env`, launcher/launch.py). tests/test_settings_table.py checks
the surfaces agree, and that docs/training.md's table of init() options says
the same. Importing this module needs neither torch nor numpy (a rank's
flags answer --help without them).

Every LTP_* variable the package reads is an entry here. The `internal`
ones are no init() option (no keyword, flag or row in the options table):
what a launcher sets for its ranks (rank, world_size, role, ...), developer
aids (profile, round_log, forkserver, ...), and knobs one module reads where
it is used (tolerant, dead_s, hang_s, ...); docs/training.md lists them in a
table of their own. Code that needs one variable outside Settings reads it
with `env(name)`; tests/test_structure.py keeps LTP_* names out of the
other modules.
"""
from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass

from ..errors import UsageError

# The surfaces a setting can have a flag on.
RANK = "rank"       # one rank's network flags (rank.py); default: the LTP_* variable
TRAIN = "train"     # the training flags of `ltp train` and a rank (args.py); default: the table's
LAUNCH = "launch"   # `ltp launch` (tools/cmd_launch.py)

MAX_SERVERS = 8
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class Setting:
    """One setting. lo/hi bound a number (lo excluded when `above`; a float is
    finite besides: nan and inf are out of bounds); `shown`
    is the default as help and docs write it; `flags` the surfaces with a
    flag for it; `launcher`: the launcher sets it in each rank's environment
    (from the rig: rank_settings); `internal`: no init() option (the
    module's doc), so no flags and no launcher copy."""

    name: str
    type: type
    default: object
    help: str
    choices: tuple = ()
    lo: float | None = None
    hi: float | None = None
    above: bool = False
    shown: str | None = None
    flags: frozenset = frozenset()
    launcher: bool = False
    metavar: str | None = None
    internal: bool = False

    def __post_init__(self):
        if self.internal and (self.flags or self.launcher):
            raise ValueError(f"{self.name}: an internal setting has no flags and no launcher copy")

    @property
    def env(self) -> str:
        return "LTP_" + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def default_text(self) -> str:
        if self.shown is not None:
            return self.shown
        return f"{self.default:g}" if self.type is float else str(self.default)

    def span(self) -> str:
        """The values in a few characters ('ltp|tcp', '1..8')."""
        if self.choices:
            return "|".join(self.choices)
        return self.takes().removeprefix("in ")

    def takes(self, lo: float | None = None) -> str:
        """What a value must be, in words ('one of ltp, tcp', 'in 576..9000')."""
        lo = self.lo if lo is None else lo
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if lo is not None and self.hi is not None:
            return f"in {_num(lo)}..{_num(self.hi)}"
        if lo is not None:
            return f"{'>' if self.above else '>='} {_num(lo)}"
        return f"a {self.type.__name__}"

    def problem(self, value, lo: float | None = None) -> str | None:
        """Why `value` is out of bounds (None: it is in them, or unset)."""
        lo = self.lo if lo is None else lo
        if value is None:
            return None
        if self.type is float and not math.isfinite(value):
            return f"must be a finite number {self.takes(lo)}, got {value!r}"
        if self.choices:
            bad = value not in self.choices
        else:
            low = lo is not None and (value <= lo if self.above else value < lo)
            bad = low or (self.hi is not None and value > self.hi)
        return f"must be {self.takes(lo)}, got {value!r}" if bad else None

    def read(self, raw):
        """`raw` (a keyword's value, or text from a variable or a flag) as this
        setting's type; ValueError if it cannot be read as one."""
        if self.type is bool:
            text = str(raw).lower()
            if text not in TRUE + FALSE:
                raise ValueError(f"cannot read {raw!r} as a bool (1 or 0)")
            return text in TRUE
        try:
            if self.type is int:
                return int(raw, 0) if isinstance(raw, str) else int(raw)
            return self.type(raw)
        except (TypeError, ValueError):
            raise ValueError(f"cannot read {raw!r} as {self.type.__name__}") from None

    def text(self, value) -> str:
        """`value` as its environment variable carries it."""
        if self.type is bool:
            return "1" if value else "0"
        return str(value)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


class BadVariable(UsageError, ValueError):
    """An LTP_* variable whose value its setting cannot take: a usage error
    (exit 2) that is a ValueError too, as any bad value is."""


def _s(name, type_, default, help_, **kw) -> Setting:
    kw["flags"] = frozenset(kw.get("flags", ()))
    return Setting(name, type_, default, help_, **kw)


def _internal(name, type_, default, help_, **kw) -> Setting:
    return _s(name, type_, default, help_, internal=True, **kw)


DOWNLINK_HELP = (
    "LTP's parameter downlink (TCP and gloo send to each worker). group: each "
    "chunk once to a broadcast or multicast address every worker receives, then what a "
    "worker missed to it alone. The address is the server rank's --group, else the IPv4 "
    "broadcast address of its --dev (on the rig: the rig's); a server with neither sends "
    "unicast and says so. Workers off the server's L2 segment miss broadcasts and get every "
    "chunk re-sent: give them a multicast --group, or use unicast. unicast: each chunk to "
    "each worker")

TABLE: dict[str, Setting] = {s.name: s for s in (
    _s("transport", str, "ltp", "ltp, or tcp: the same server over TCP (a baseline)",
       choices=("ltp", "tcp"), flags=(LAUNCH,), launcher=True),
    _s("dev", str, None, "the NIC that carries training traffic (LTP's XDP program attaches "
       "here; gloo's sockets too)", shown="-", flags=(RANK,), launcher=True),
    _s("ip", str, None, "this rank's IPv4 address on --dev", shown="dev's address",
       flags=(RANK,), launcher=True),
    _s("xdp_mode", str, "native", "skb for drivers without native XDP",
       choices=("native", "skb"), flags=(RANK,), launcher=True),
    _s("capacity", float, 1e9, "bottleneck rate toward the server in bit/s: LTP rate shares, "
       "Early Close deadlines; at least 1000 (ACKs carry shares in kbit/s)", lo=1000,
       shown="1e9", flags=(RANK,), launcher=True),
    _s("mtu", int, 1500, "path MTU (a chunk is what one frame carries after the headers)",
       lo=576, hi=9000, flags=(RANK,), launcher=True),
    _s("group", str, None, "broadcast or multicast address every worker receives, for the "
       "group downlink (read by the server)", shown="dev's broadcast address", metavar="ADDR",
       flags=(RANK,), launcher=True),
    _s("downlink", str, "group", DOWNLINK_HELP, choices=("group", "unicast"), flags=(TRAIN,)),
    _s("loss_budget", float, 0.0, "Early Close's loss budget: the error the filled part of a "
       "step's gradients may carry, against the aggregate's own sampling noise (0: none, or "
       "the loss policy's under auto; 0.35 closes rounds at 12 % loss without waiting for "
       "re-sends; docs/transport.md); given, it holds under every loss policy",
       lo=0, hi=0.99, flags=(TRAIN,)),
    _s("downlink_code", str, "off", "erasure-code LTP's parameter downlink: rs: Reed-Solomon "
       "parity per group of 32 chunks, as much as the loss the server's last answers met "
       "calls for (none at 0 %), so a worker rebuilds lost chunks without a round trip; "
       "off: repair by re-sends alone (the default: on this rig the encoding costs more "
       "than the round trips it saves, docs/benchmarks.md). The server's choice rules",
       choices=("rs", "off"), flags=(RANK,)),
    _s("loss_policy", str, "auto", "what LTP does with the loss a step meets: repair: "
       "re-send every chunk of an answer some worker lost, and close uplink rounds by the "
       "paper's rule (the loss budget only if given); defer: answer once, and every worker "
       "zeroes the chunks any of them may lack, which the server adds into its next answer "
       "(a step late, alike on every replica; needs compress none and downlink_code off); "
       "auto: answers repaired, and a loss budget chosen per step from the uplink loss the "
       "server measures, none on a lossless or lightly lossy path, from the second step "
       "(loss_warmup), and with compress auto float32 gradients as bfloat16 under heavy loss "
       "(docs/transport.md, The loss policy). The server's choice rules",
       choices=("auto", "repair", "defer"), flags=(TRAIN,)),
    _s("checksums", str, "auto", "verify each LTP DATA frame's UDP checksum in XDP, so a "
       "corrupted frame is never used (counted bad_csum, re-sent or filled): auto: where "
       "frames carry whole sums (a NIC; not a veth or loopback, whose local sockets leave "
       "the sum to offload); on; off (docs/operations.md)", choices=("auto", "on", "off"),
       flags=(RANK,)),
    _s("servers", int, 1, "server ranks, each summing a contiguous slice of every bucket on a "
       "host of its own (docs/training.md, Sharded servers)", lo=1, hi=MAX_SERVERS,
       flags=(TRAIN, LAUNCH), launcher=True),
    _s("colocate", bool, False, "no server ranks: trainer r of N starts server r of N as its "
       "child process, summing slice r of every bucket; over LTP a seat of the trainer's "
       "device on udp_port + 1000 (at most 8 trainers; docs/deploy.md, Co-located servers). "
       "Unset, the ltp backend co-locates where no variable names a server rank "
       "(LTP_SERVERS, LTP_RANK, LTP_ROLE, LTP_WORLD_SIZE: torchrun alone), and so does init() "
       "where no keyword names one either (servers, role)",
       shown="0; backend: auto"),
    _s("netns", str, None, "the network namespace this rank runs in, if not the host's (names "
       "the endpoint's pins for `ltp status`)", shown="-", flags=(RANK,), launcher=True),
    _s("node", str, None, "the machine this rank counts as on, where its namespace is a "
       "device of a shared NIC (a rig's node: `ltp rig up --nodes`); ranks of one node are "
       "one host to local_rank()", shown="-", flags=(RANK,), launcher=True),
    _s("store_netns", str, None, "open the store connection from inside this network "
       "namespace", shown="-", flags=(RANK,), launcher=True),
    _s("timeout", float, 300.0, "seconds any one wait may take before the rank gives up",
       lo=0, above=True, flags=(RANK,)),
    _s("cc", str, "cubic", "TCP congestion control, e.g. cubic, bbr, reno (transport tcp)",
       metavar="CC", flags=(TRAIN,)),
    _s("job", int, 0x7472, "the LTP job cookie (every rank alike)", lo=0, hi=0xFFFFFFFF,
       shown="0x7472", flags=(RANK,)),
    _s("tcp_port", int, 0, "the TCP server's listening port (transport tcp; 0: any)",
       lo=0, hi=65535, flags=(RANK,)),
    _s("udp_port", int, 7410, "this rank's LTP UDP port: its XDP program's and its socket's "
       "(ranks sharing one device each need a port of their own: share_dev)",
       lo=1, hi=65535, flags=(RANK,), launcher=True),
    _s("share_dev", bool, False, "share dev with the host's other ranks: this rank's XDP "
       "program takes a seat of the device's mux, found by its port, instead of owning the "
       "device (several ranks on one NIC; docs/deploy.md); its answers then come by unicast. "
       "Over LTP, unset with udp_port unset too, where LOCAL_WORLD_SIZE > 1 (torchrun "
       "--nproc-per-node): on, on port 7411 + LOCAL_RANK",
       shown="0", flags=(RANK,), launcher=True),
    _s("bucket_mb", float, 4.0, "the largest LTP round of a step's gradients, MB: "
       "DistributedOptimizer's default bucket size, and the pieces DDP's buckets are cut "
       "into (each piece's answer leaves as soon as its round is summed)", lo=0, above=True),
    _s("loss_warmup", int, 0, "steps the loss policy auto closes rounds by the paper's rule "
       "before it gives them a loss budget, then as many to ramp the budget up (0: a budget "
       "from the second step, once the first has measured the loss; a budget alone cost "
       "no accuracy early in training: docs/transport.md, The loss policy)",
       lo=0, hi=1_000_000),
    _s("stream_share", float, 0.5, "the share of the path's rate a step's answer takes "
       "while the step's later rounds still come in (each round's part leaves once it is "
       "summed; the rest, at the full rate, after the last round); 0: every answer whole "
       "after the last round (docs/transport.md, Streamed answers)", lo=0, hi=1),
    _s("compress", str, "auto", "a step's gradients on the wire: auto (bfloat16 or float16 "
       "gradients as 2 bytes, exactly; any other as float32, and a bsp step's all-float32 ones "
       "as bfloat16, their rounding carried, while the loss policy measures heavy loss), none "
       "(float32 at any loss), uint8 (8-bit "
       "codes with a min and a scale per LTP chunk: about a quarter of the bytes each way), "
       "bf16 or fp16 (every gradient rounded to 2 bytes); ltp and tcp; docs/training.md, "
       "Compression", choices=("auto", "none", "uint8", "bf16", "fp16"), flags=(TRAIN,)),
    _s("error_feedback", bool, True, "with compress (or the loss policy's bfloat16 wire), "
       "carry each rounding error into the next step; 0 on the server: the loss policy "
       "never chooses that wire", shown="1"),
    _s("max_missed", int, 3, "drop a worker that delivered nothing of K steps in a row; "
       "training goes on without it until it rejoins", lo=1, metavar="K", flags=(TRAIN,)),
    _s("sender", str, "auto", "how LTP DATA leaves: xdp (the ACK clock: each ACK turned into "
       "the next chunk at the NIC), socket (paced by Python), or auto: xdp where `ltp doctor`'s "
       "grow check passes, else socket, and socket toward a peer whose packets are lost more "
       "than 6 % of the time (docs/transport.md)",
       choices=("auto", "socket", "xdp"), flags=(TRAIN,)),
    _s("secret_file", str, None, "a file holding the job key as hex on a server rank, a "
       "worker's own member key file on a worker (`ltp key member`; mode 0600 or stricter; "
       "`ltp launch` and `ltp train` make them per job): LTP's round tokens, the answers' "
       "and the store values' signatures derive from it; without one tokens are off and the "
       "store's values are not authenticated (docs/operations.md, \"Threat model\")", shown="-",
       metavar="FILE"),
    _s("require_secret", bool, None, "refuse to start without a job key (secret_file) "
       "instead of running with tokens off and a warning; by default where the store "
       "(MASTER_ADDR) is not on loopback", shown="auto"),
    _s("run_id", str, None, "this run's id: the round tokens, the answers' and the store "
       "values' signatures and the TCP hellos derived from the job key are bound to it, so "
       "what was recorded in another run under the same key is refused (every rank alike; "
       "default: torchrun's run id, --rdzv-id, unless it is \"none\", else one rank 0 draws "
       "and publishes; `ltp launch` and `ltp train` draw one per job)", shown="-",
       metavar="ID"),
    _s("trace", str, None, "write a Chrome trace-event JSON file (Perfetto, chrome://tracing) "
       "of the job's rounds: per server its rounds and answers, per worker its barrier, "
       "pushes and answers and its chunks' first and last arrival at the server's NIC "
       "(docs/slow-or-stuck.md)", shown="-", metavar="FILE.json", flags=(TRAIN,)),
    _s("buffer", int, 0, "the bottleneck's queue in bytes: with sender xdp a receiver's "
       "credit is this plus one BDP", lo=0, shown="0 (32 KiB)", metavar="BYTES",
       flags=(RANK,), launcher=True),
    # --- internal: no init() option (the module's doc; docs/training.md,
    # "Other environment variables"). What a launcher sets for each rank:
    _internal("rank", int, None, "this rank's place in the LTP job, servers first", lo=0,
              shown="-"),
    _internal("world_size", int, None, "the LTP job's ranks, servers and trainers", lo=1,
              shown="-"),
    _internal("role", str, None, "server on a server rank", choices=("server", "worker"),
              shown="-"),
    _internal("progress", str, None, "json: report_progress writes JSON events for the "
              "launcher", shown="-"),
    _internal("flight_dir", str, None, "the job's flight-recorder folder (a rank records "
              "there; the launcher's own: else a temporary one)", shown="-"),
    _internal("trace_ranks", bool, False, "1: a worker writes its own trace file too "
              "(TRACE.worker<W>)", shown="0"),
    # knobs read where they are used
    _internal("tolerant", str, "backward", "the `ltp` backend's rule for what is "
              "loss-tolerant", choices=("backward", "hook", "never")),
    _internal("early_close", str, None, "EarlyCloseConfig fields as JSON for the `ltp` "
              "backend's own buckets", shown="-"),
    _internal("dead_s", float, 2.0, "seconds without a heartbeat that make a rank dead",
              lo=0, above=True),
    _internal("flight", bool, True, "0 turns the flight recorder off", shown="1"),
    _internal("stall_k", float, 1.5, "a wait on others past this many median op intervals "
              "is a stall", lo=0, above=True),
    _internal("stall_min_s", float, 0.25, "the least seconds a stalled wait has waited",
              lo=0, above=True),
    _internal("hang_s", float, 2.0, "a stalled wait still the same this long after its "
              "dump is a hang (the launcher's)", lo=0),
    # developer aids
    _internal("forkserver", bool, True, "0: ranks start as new interpreters, not forked "
              "from the fork server", shown="1"),
    _internal("cache_dir", str, "/var/cache/ltpx", "the compiled BPF objects' cache folder"),
    _internal("keep_logs", bool, False, "1: `ltp train` keeps its ranks' logs after a good "
              "run", shown="0"),
    _internal("round_log", bool, False, "1: a server logs every uplink round on stderr",
              shown="0"),
    _internal("profile", str, None, "cProfile a bench worker process into FILE.<pid>",
              shown="-"),
    _internal("tcp_threads", bool, True, "0: the TCP server reads and writes a large piece "
              "in one epoll loop, not on a thread per worker, and reads no round ahead (an "
              "A/B knob)", shown="1"),
    _internal("group_alone", bool, True, "0: a group push re-sends a chunk only one target "
              "lacks to the group too, not to that target alone (an A/B knob)", shown="1"),
    _internal("sum_kernel", str, "auto", "a server's summing: auto (the C kernel, built once "
              "with the C compiler; numpy where none builds) or numpy (an A/B knob)",
              choices=("auto", "numpy")),
    _internal("colocate_thread", bool, False, "1: a co-located trainer's server runs on a "
              "thread of its own process (its own slice handed over in memory), not as a "
              "child process (an A/B knob)", shown="0"),
    _internal("tcp_local", bool, True, "0: a worker on its TCP server's host connects by TCP, "
              "not by a Unix socket (an A/B knob)", shown="1"),
)}

# The choices, in one order each (the default first)
TRANSPORTS = TABLE["transport"].choices
XDP_MODES = TABLE["xdp_mode"].choices
DOWNLINKS = TABLE["downlink"].choices
COMPRESS = TABLE["compress"].choices
EXACT_COMPRESS = ("auto", "none")   # the compress settings that round no gradient
SENDERS = TABLE["sender"].choices
LAUNCHED = tuple(s.name for s in TABLE.values() if s.launcher)
# init()'s options: every setting but the internal ones
OPTIONS: dict[str, Setting] = {n: s for n, s in TABLE.items() if not s.internal}


def flag_type(s: Setting, lo: float | None = None):
    """argparse's type for s's flag: read and bounds-checked, so a bad value
    is a usage error (exit 2) naming the flag."""
    def parse(text: str):
        try:
            value = s.read(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        why = None if s.choices else s.problem(value, lo)
        if why:
            raise argparse.ArgumentTypeError(why)
        return value
    parse.__name__ = s.type.__name__     # argparse names the type in its messages
    return parse


def add_flag(p, name: str, surface: str, *, lo: float | None = None, help: str = "") -> None:
    """Add setting `name`'s flag for `surface` to parser (or group) `p`. On
    RANK the default is None (then lt.init() reads the variable, else the
    table's default); elsewhere the table's default. `lo` and `help` widen a
    surface's bound or add what the flag means there."""
    s = TABLE[name]
    if surface not in s.flags:
        raise ValueError(f"{name}: no {surface} flag in the settings table")
    if surface != RANK:
        where = f"default {s.default_text}"
    else:
        where = f"default: {s.env}" + (f", else {s.default_text}" if s.default is not None
                                       or s.shown != "-" else "")
    if s.hi is not None:
        where = f"{s.takes(lo)[3:]}; {where}"
    p.add_argument(s.flag, type=flag_type(s, lo), choices=s.choices or None,
                   default=None if surface == RANK else s.default, metavar=s.metavar,
                   help=f"{s.help}{help} ({where})".replace("%", "%%"))


def to_env(values: dict) -> dict[str, str | None]:
    """The LTP_* variables for settings `values` (name -> value; None: the
    variable is unset)."""
    return {TABLE[k].env: None if v is None else TABLE[k].text(v) for k, v in values.items()}


def read(name: str, raw, where: str):
    """Setting `name` read from `raw` (what `where` gave); UsageError names both."""
    try:
        return TABLE[name].read(raw)
    except ValueError as e:
        raise UsageError(f"{where}: {e} for {name}") from None


def env(name: str, environ=None):
    """Setting `name` from its variable alone (in `environ`, default
    os.environ), for code that needs one outside Settings.resolve: unset or
    empty gives the table's default; a value that cannot be read or is out
    of bounds is a BadVariable (a ValueError) naming the variable."""
    s = TABLE[name]
    raw = (os.environ if environ is None else environ).get(s.env)
    if not raw:
        return s.default
    try:
        value = s.read(raw)
    except ValueError as e:
        raise BadVariable(f"{s.env}: {e}") from None
    why = s.problem(value)
    if why:
        raise BadVariable(f"{s.env} {why}")
    return value
