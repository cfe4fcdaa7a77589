# SPDX-License-Identifier: Apache-2.0
"""One settings table (control/settings_table.py) makes every surface, and they agree:
lt.init()'s keywords and defaults, the LTP_* variables it reads, the flags of a
rank, `ltp train` and `ltp launch`, the environment the launcher gives each rank,
and docs/training.md's table of init() options; the internal entries (no init()
option) stay off those surfaces, are read by `env` alone, and have a docs table
of their own. No root, no rig, no torch.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import pytest

from ltpx.control import settings_table
from ltpx.control.settings_table import (LAUNCH, LAUNCHED, OPTIONS, RANK, TABLE, TRAIN,
                                         BadVariable, Setting, add_flag)
from ltpx.control.torchapi.settings import ENV, Settings
from ltpx.errors import UsageError

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parent.parent / "docs" / "training.md"


def _sample(s):
    """A value of setting s other than its default, within its bounds."""
    if s.choices:
        return next(c for c in s.choices if c != s.default)
    if s.type is bool:
        return not s.default
    if s.type is str:
        return "x9"
    if s.lo is not None and s.hi is not None and s.hi - s.lo < 3:   # a narrow range
        value = s.type((s.lo + s.hi) / 2)
        return value if value != s.default else s.type(s.hi)
    value = s.type(s.lo + 2 if s.lo is not None else 7)
    return value if value != s.default else value + 1


def _outside(s):
    """Text for setting s's variable or flag that is out of its bounds (None: it has none)."""
    if s.choices:
        return "no-such-" + s.name
    if s.hi is not None:
        return str(s.type(s.hi + 1))
    if s.lo is not None:
        return str(s.type(s.lo if s.above else s.lo - 1))
    return None


BOUNDED = [s for s in OPTIONS.values() if _outside(s) is not None]
INTERNAL = [s for s in TABLE.values() if s.internal]


@pytest.fixture
def no_ltp_env(monkeypatch):
    """This process's environment without LTP_* variables (the launcher copies it)."""
    import os
    for var in [v for v in os.environ if v.startswith("LTP_")]:
        monkeypatch.delenv(var)


def _parsers():
    """{surface name: parser}: `ltp train`, `ltp launch`, a rank."""
    from ltpx.control.training.rank import build_parser
    from ltpx.tools.cli import build_parser as cli_parser
    sub = next(a for a in cli_parser()._actions if a.dest == "command")
    return {"train": sub.choices["train"], "launch": sub.choices["launch"],
            "rank": build_parser()}


def _action(parser, flag):
    return next((a for a in parser._actions if flag in a.option_strings), None)


# --------------------------------------------------------------------------- lt.init and LTP_*

def test_every_setting_is_an_init_keyword_with_the_tables_default():
    assert [f.name for f in dataclasses.fields(Settings)] == list(OPTIONS)
    assert Settings() == Settings.resolve({}, environ={})
    for name, s in OPTIONS.items():
        assert getattr(Settings(), name) == s.default
        assert getattr(Settings.resolve({name: _sample(s)}, environ={}), name) == _sample(s)
    with pytest.raises(UsageError, match="unknown option 'nope'"):
        Settings.resolve({"nope": 1}, environ={})


def test_every_setting_is_read_from_its_variable_and_a_keyword_wins():
    assert {name: "LTP_" + name.upper() for name in OPTIONS} == ENV
    for name, s in OPTIONS.items():
        env = {s.env: s.text(_sample(s))}
        assert getattr(Settings.resolve({}, environ=env), name) == _sample(s), s.env
        if s.default is not None:
            assert getattr(Settings.resolve({name: s.default}, environ=env), name) == s.default
    got = Settings.resolve({}, environ={"LTP_JOB": "0x10", "LTP_ERROR_FEEDBACK": "off",
                                        "LTP_CAPACITY": "25e9"})
    assert (got.job, got.error_feedback, got.capacity) == (16, False, 25e9)


@pytest.mark.parametrize("s", BOUNDED, ids=lambda s: s.name)
def test_a_variable_out_of_bounds_is_a_usage_error_naming_it(s):
    with pytest.raises(UsageError, match=f"{s.name} must be .*{s.env}"):
        Settings.resolve({}, environ={s.env: _outside(s)})


FLOATS = [s for s in OPTIONS.values() if s.type is float]


@pytest.mark.parametrize("text", ["nan", "inf", "-inf"])
def test_a_float_setting_is_finite_from_a_variable_a_keyword_and_a_flag(text, capsys):
    """nan passes no comparison and inf every upper one: both are refused by
    name (capacity=inf or nan once reached the rate shares' int())."""
    assert FLOATS, "the table has float settings"
    rank = _parsers()["rank"]
    for s in FLOATS:
        with pytest.raises(UsageError, match=f"{s.name} must be a finite number .*{s.env}"):
            Settings.resolve({}, environ={s.env: text})
        with pytest.raises(UsageError, match=f"{s.name} must be a finite number"):
            Settings.resolve({s.name: float(text)}, environ={})
        if RANK in s.flags:
            with pytest.raises(SystemExit) as e:
                rank.parse_args([f"{s.flag}={text}"])
            assert e.value.code == 2 and "finite" in capsys.readouterr().err


def test_capacity_is_at_least_the_kbit_the_acks_carry():
    """ACKs carry a flow's share in kbit/s: below 1000 bit/s it would read 0."""
    assert Settings.resolve({}, environ={"LTP_CAPACITY": "1000"}).capacity == 1000.0
    for text in ("999", "0", "1e-300"):
        with pytest.raises(UsageError, match="capacity must be >= 1000"):
            Settings.resolve({}, environ={"LTP_CAPACITY": text})


def test_a_variable_that_cannot_be_read_is_a_usage_error_naming_it():
    for var, text in (("LTP_MTU", "big"), ("LTP_TIMEOUT", "soon"), ("LTP_ERROR_FEEDBACK", "maybe")):
        with pytest.raises(UsageError, match=f"{var}: cannot read {text!r}"):
            Settings.resolve({}, environ={var: text})


# --------------------------------------------------------------------------- flags

def test_every_flag_is_on_the_surfaces_the_table_names_with_one_default():
    parsers = _parsers()
    on = {RANK: ["rank"], TRAIN: ["train", "rank"], LAUNCH: ["launch"]}
    for s in OPTIONS.values():   # internal ones have none (a rank's --early-close is its job's)
        for surface in s.flags:
            for where in on[surface]:
                a = _action(parsers[where], s.flag)
                assert a is not None, (where, s.flag)
                assert a.default == (None if surface == RANK else s.default), (where, s.flag)
                assert tuple(a.choices or ()) == s.choices, (where, s.flag)
                assert f"default{':' if surface == RANK else ''} " in a.help
                assert s.default_text in a.help or s.default_text == "-", (where, s.flag)
        # a rank has a flag for a setting exactly when the table gives it one
        assert (_action(parsers["rank"], s.flag) is not None) == bool(s.flags & {RANK, TRAIN}) \
            or s.name == "transport"


def test_flags_read_the_tables_types():
    rank = _parsers()["rank"]
    a = rank.parse_args(["--mtu", "9000", "--job", "0x10", "--capacity", "25e9",
                         "--servers", "3", "--max-missed", "5"])
    assert (a.mtu, a.job, a.capacity, a.servers, a.max_missed) == (9000, 16, 25e9, 3, 5)


FLAG_CASES = [(where, s.flag, _outside(s)) for s in BOUNDED for surface in sorted(s.flags)
              for where in {RANK: ["rank"], TRAIN: ["train", "rank"], LAUNCH: []}[surface]]
FLAG_CASES += [("launch", "--servers", "9"), ("launch", "--servers", "-1"),
               ("launch", "--transport", "gloo"), ("rank", "--mtu", "big")]


@pytest.mark.parametrize("where, flag, text", FLAG_CASES)
def test_a_flag_out_of_bounds_is_a_usage_error(where, flag, text, capsys):
    if where == "rank":
        with pytest.raises(SystemExit) as e:
            _parsers()[where].parse_args([flag, text])
        assert e.value.code == 2 and f"argument {flag}" in capsys.readouterr().err
        return
    from ltpx.tools.cli import main
    assert main([where, "-j", flag, text, "--", "true"]) == 2
    err = json.loads(capsys.readouterr().out)
    assert err["exit_code"] == 2 and f"argument {flag}" in err["error"]


def test_launch_takes_no_servers_and_a_rank_needs_one():
    parsers = _parsers()
    assert parsers["launch"].parse_args(["--servers", "0", "--", "true"]).servers == 0
    with pytest.raises(SystemExit):
        parsers["rank"].parse_args(["--servers", "0"])


def test_a_ranks_flags_become_init_keywords_and_unset_ones_leave_the_variable(monkeypatch):
    from ltpx.control.training.args import config_from_args
    from ltpx.control.training.rank import ltp_options
    rank = _parsers()["rank"]
    argv, want = [], {}
    for s in TABLE.values():
        if s.flags & {RANK, TRAIN} and s.name not in ("transport", "loss_policy"):
            argv += [s.flag, s.text(_sample(s))]
            want[s.name] = _sample(s)
    want["loss_policy"] = TABLE["loss_policy"].default   # defer: ltp's, without compress
    a = rank.parse_args(argv + ["--transport", "ddp-ltp"])
    monkeypatch.delenv("LTP_COLOCATE", raising=False)
    opts = ltp_options(a, config_from_args(a))
    # the built-in job's server ranks are its own: not co-located by default
    assert set(opts) == set(want) | {"transport", "colocate"} and opts["colocate"] is False
    monkeypatch.setenv("LTP_COLOCATE", "1")      # ltp launch --colocate --share-nic says
    assert "colocate" not in ltp_options(a, config_from_args(a))
    monkeypatch.delenv("LTP_COLOCATE")
    got = Settings.resolve(opts, environ={})
    assert got.transport == "ltp" and {k: getattr(got, k) for k in want} == want
    a = rank.parse_args(["--transport", "ltp", "--loss-policy", "defer"])
    assert Settings.resolve(ltp_options(a, config_from_args(a)), environ={}).loss_policy == \
        "defer"
    a = rank.parse_args([])
    env = {TABLE[k].env: TABLE[k].text(want[k]) for k in want if RANK in TABLE[k].flags}
    got = Settings.resolve(ltp_options(a, config_from_args(a)), environ=env)
    assert all(getattr(got, k) == want[k] for k in want if RANK in TABLE[k].flags)


# --------------------------------------------------------------------------- the launcher

def _launch_rig(argv):
    """(parsed `ltp launch` flags, the rig they describe, its ranks): nothing is built."""
    from ltpx.control.launcher.plan import plan_ranks
    from ltpx.dataplane.rig.star import Rig
    from ltpx.tools import cmd_launch_checks
    args = _parsers()["launch"].parse_args(argv + ["--", "true"])
    cmd_launch_checks.check_args(args)
    rig = Rig(dataclasses.replace(args.rig_config, name="stt"))
    return args, rig, plan_ranks(rig, args.workers, args.servers, args.colocate,
                                 args.ranks_per_node)


@pytest.mark.parametrize("argv", [[], ["--transport", "tcp", "--servers", "2", "--mtu", "3000",
                                       "--rate", "100mbit", "--buffer", "60kb"],
                                  ["--transport", "tcp", "--workers", "4", "--ranks-per-node",
                                   "2", "--colocate"],
                                  ["--workers", "4", "--ranks-per-node", "2", "--colocate"]])
def test_launch_flags_to_rank_environment_to_settings_round_trip(argv, no_ltp_env):
    from ltpx.control.launcher.launch import job_env, rank_settings
    args, rig, ranks = _launch_rig(argv)
    for r in ranks:
        env = job_env(rig, r, len(ranks), 29500, servers=args.servers, transport=args.transport)
        given = rank_settings(rig, r, servers=args.servers, transport=args.transport)
        assert set(given) == set(LAUNCHED)
        assert {v for v in env if v.startswith("LTP_") and v[4:].lower() in OPTIONS} == \
            {TABLE[k].env for k in LAUNCHED if given[k] is not None}    # node: a rig's nodes
        got = Settings.resolve({}, environ=env)
        assert got == dataclasses.replace(Settings(), **given), r.label
        assert (got.transport, got.servers, got.mtu, got.dev, got.netns) == \
            (args.transport, args.servers, args.mtu, r.host.ifname, r.host.netns)
        assert got.capacity == rig.config.rate_bps and got.buffer == rig.config.buffer_bytes


def test_over_ltp_ranks_on_one_node_each_have_a_device_and_count_as_one_host(no_ltp_env):
    # over LTP an endpoint owns its device: 2 nodes of 2 trainers and a server
    # beside each, every rank in a namespace of its own, a node's sharing its link
    from ltpx.control.launcher.launch import job_env
    args, rig, ranks = _launch_rig(["--workers", "4", "--ranks-per-node", "2", "--colocate"])
    c = rig.config
    assert (c.workers, c.servers, c.nodes, c.colocate, c.shape) == (4, 4, 2, True, "all")
    env = {r.label: job_env(rig, r, len(ranks), 29500, servers=args.servers) for r in ranks}
    got = {lb: tuple(e[k] for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                    "LTP_NODE", "LTP_NETNS"))
           for lb, e in env.items()}
    ns = {h.name: h.netns for h in rig.hosts}
    n0, n1 = "stt-n0", "stt-n1"
    assert got == {"s0": ("0", "0", "1", "0", n0, ns["ps"]),
                   "s1": ("0", "0", "1", "0", n0, ns["ps1"]),
                   "s2": ("0", "0", "1", "1", n1, ns["ps2"]),
                   "s3": ("0", "0", "1", "1", n1, ns["ps3"]),
                   "w0": ("0", "0", "2", "0", n0, ns["w0"]),
                   "w1": ("1", "1", "2", "0", n0, ns["w1"]),
                   "w2": ("2", "0", "2", "1", n1, ns["w2"]),
                   "w3": ("3", "1", "2", "1", n1, ns["w3"])}
    assert len({e["LTP_DEV"] + e["LTP_NETNS"] for e in env.values()}) == 8
    # what shares a node's link: its trainers' devices (one each, for every
    # server: transport/roundspace.py) and its servers'
    assert [h.name for h in rig.node_devices(0)] == ["ps", "ps1", "w0", "w1"]


def test_rig_nodes_are_checked_and_placed():
    from ltpx.dataplane.rig.star import Rig, RigConfig
    for kw, field in [(dict(workers=4, nodes=3, shape="all"), "nodes"),
                      (dict(workers=4, nodes=2), "nodes"),                 # shape ps
                      (dict(workers=4, servers=2, nodes=2, shape="all", colocate=True),
                       "colocate"),
                      (dict(workers=4, servers=4, shape="all", colocate=True), "colocate")]:
        with pytest.raises(ValueError, match=f"^{field}:"):
            RigConfig(name="x", **kw)
    rig = Rig(RigConfig(name="x", workers=4, nodes=2, shape="all"))   # a dedicated server
    assert [rig.config.node_of(h) for h in rig.hosts] == [None, 0, 0, 1, 1]
    assert rig.shaped_ports == ["sw-ps", "n0-down", "n0-up", "n1-down", "n1-up"]


def test_hosts_of_two_trainers_and_colocated_servers_get_torchruns_numbers(no_ltp_env):
    from ltpx.control.launcher.launch import job_env
    args, rig, ranks = _launch_rig(["--transport", "tcp", "--workers", "4",
                                    "--ranks-per-node", "2", "--colocate"])
    assert len(rig.workers) == 2 and args.servers == 4      # two hosts, a server per trainer
    env = {r.label: job_env(rig, r, len(ranks), 29500, servers=args.servers) for r in ranks}
    got = {lb: tuple(e[k] for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                    "LTP_RANK", "LTP_ROLE", "LTP_NETNS", "LTP_IP"))
           for lb, e in env.items()}
    ns, ip = rig.workers[0].netns, rig.workers[0].ip
    ns1, ip1 = rig.workers[1].netns, rig.workers[1].ip
    assert got == {"s0": ("0", "0", "1", "0", "0", "server", ns, ip),
                   "s1": ("0", "0", "1", "0", "1", "server", ns, ip),
                   "s2": ("0", "0", "1", "1", "2", "server", ns1, ip1),
                   "s3": ("0", "0", "1", "1", "3", "server", ns1, ip1),
                   "w0": ("0", "0", "2", "0", "4", "worker", ns, ip),
                   "w1": ("1", "1", "2", "0", "5", "worker", ns, ip),
                   "w2": ("2", "0", "2", "1", "6", "worker", ns1, ip1),
                   "w3": ("3", "1", "2", "1", "7", "worker", ns1, ip1)}
    assert {e["WORLD_SIZE"] for e in env.values()} == {"4"} and \
        {e["LTP_WORLD_SIZE"] for e in env.values()} == {"8"}


def test_ranks_that_outnumber_the_machines_cores_get_a_longer_dead_s(monkeypatch, no_ltp_env):
    """Every rig rank shares this machine's cores: past 4 processes a core
    the launcher gives each rank a longer LTP_DEAD_S (its heartbeat thread
    lags with the load), counting a co-located trainer's server process;
    an operator's LTP_DEAD_S stands, and a small job gets none."""
    from ltpx.control import settings_table
    from ltpx.control.launcher import launch
    assert launch.shared_dead_s(4, 2) == 2.0 and launch.shared_dead_s(16, 2) == 4.0
    monkeypatch.setattr(launch.os, "cpu_count", lambda: 2)
    _, rig, ranks = _launch_rig(["--workers", "8", "--ranks-per-node", "2", "--colocate"])
    env = launch.job_env(rig, ranks[0], len(ranks), 29500, servers=8)   # 8 + 8 ranks
    assert settings_table.env("dead_s", environ=env) == 4.0
    _, rig, ranks = _launch_rig(["--workers", "8", "--servers", "0"])  # trainers alone ...
    env = launch.job_env(rig, ranks[0], 8, 29500, servers=0, colocated=True)   # ... + servers
    assert settings_table.env("dead_s", environ=env) == 4.0
    _, rig, ranks = _launch_rig(["--workers", "2"])
    assert "LTP_DEAD_S" not in launch.job_env(rig, ranks[0], len(ranks), 29500, servers=1)
    monkeypatch.setenv("LTP_DEAD_S", "9")
    _, rig, ranks = _launch_rig(["--workers", "8", "--ranks-per-node", "2", "--colocate"])
    assert launch.job_env(rig, ranks[0], len(ranks), 29500, servers=8)["LTP_DEAD_S"] == "9"


def test_launch_passes_the_other_settings_on_and_owns_its_own(monkeypatch, no_ltp_env):
    from ltpx.control.launcher.launch import job_env
    monkeypatch.setenv("LTP_COMPRESS", "uint8")      # not the launcher's: passed on
    monkeypatch.setenv("LTP_GROUP", "10.9.9.255")    # the launcher's: replaced or removed
    monkeypatch.setenv("LTP_MTU", "9000")
    args, rig, ranks = _launch_rig([])
    env = job_env(rig, ranks[1], len(ranks), 29500, servers=1)
    assert env["LTP_COMPRESS"] == "uint8" and env["LTP_MTU"] == "1500"
    assert env["LTP_GROUP"] != "10.9.9.255"
    assert "LTP_GROUP" not in job_env(rig, ranks[1], len(ranks), 29500, servers=1, group=False)
    assert Settings.resolve({}, environ=env).compress == "uint8"


def test_a_train_job_config_and_its_rank_environment_make_the_settings_asked_for(no_ltp_env):
    # ltp train: the TrainConfig travels in --config, the host's settings in LTP_*
    from ltpx.control.training.args import config_from_args
    from ltpx.control.launcher.launch import job_env
    from ltpx.control.launcher.plan import plan_ranks
    from ltpx.control.training.onrig import rank_argv, rig_config
    from ltpx.control.training.rank import build_parser, ltp_options
    from ltpx.dataplane.rig.star import Rig
    train = _parsers()["train"]
    cfg = config_from_args(train.parse_args(["--compress", "uint8", "--sender", "xdp",
                                             "--max-missed", "4", "--downlink", "unicast"]))
    rig = Rig(rig_config("stt", "ltp", workers=2, rate_bps=10**8, buffer_bytes=30_000, loss=0))
    ranks = plan_ranks(rig, 2, cfg.servers)
    env = job_env(rig, ranks[2], len(ranks), 29500, servers=cfg.servers,
                  group=cfg.downlink == "group")
    a = build_parser().parse_args(rank_argv(cfg, 60.0, None, None)[3:])
    got = Settings.resolve(ltp_options(a, cfg), environ=env)
    assert (got.compress, got.sender, got.max_missed, got.downlink) == ("uint8", "xdp", 4,
                                                                        "unicast")
    assert (got.dev, got.capacity, got.timeout, got.group) == (ranks[2].host.ifname, 1e8,
                                                                60.0, None)


# --------------------------------------------------------------------------- the docs

def _docs_table(after: str) -> str:
    """The first table of docs/training.md after the text `after`."""
    text = DOCS.read_text()
    return next(part for part in text[text.index(after):].split("\n\n")
                if part.startswith("| "))


def _docs_rows() -> dict[str, tuple[str, str]]:
    """docs/training.md's init() options: keyword -> (variable, default), backticks gone."""
    table = _docs_table("`init()` options")
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        m = re.fullmatch(r"`(\w+)`", cells[0])
        if m:
            rows[m.group(1)] = (cells[1].replace("`", ""), cells[2].replace("`", ""))
    return rows


def test_the_docs_table_of_init_options_says_what_the_table_does():
    rows = _docs_rows()
    assert set(rows) == set(OPTIONS), "docs/training.md: one row per init() option"
    for name, s in OPTIONS.items():
        assert rows[name] == (s.env, s.default_text), name


def test_the_docs_table_of_other_variables_says_what_the_table_does():
    """The internal entries' table: one row per variable, its default the table's."""
    rows = {}
    for line in _docs_table("Other environment variables").splitlines()[2:]:
        cells = [c.strip().replace("`", "") for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1]
    assert rows == {s.env: s.default_text for s in INTERNAL}


# --------------------------------------------------------------------------- internal entries

def test_internal_entries_are_no_init_option_and_have_no_flag():
    assert INTERNAL and not set(OPTIONS) & {s.name for s in INTERNAL}
    for s in INTERNAL:
        assert not s.flags and not s.launcher and s.name not in LAUNCHED, s.name
        with pytest.raises(ValueError, match="no rank flag"):
            add_flag(argparse.ArgumentParser(), s.name, RANK)
        with pytest.raises(UsageError, match=f"unknown option {s.name!r}"):
            Settings.resolve({s.name: _sample(s)}, environ={})
        # its variable is no init() option: resolve leaves it alone
        assert Settings.resolve({}, environ={s.env: "no-such-value"}) == Settings()
    with pytest.raises(ValueError, match="no flags"):
        Setting("x", int, 0, "x", flags=frozenset({RANK}), internal=True)


@pytest.mark.parametrize("s", list(TABLE.values()), ids=lambda s: s.name)
def test_env_reads_one_variable_as_its_setting(s):
    assert settings_table.env(s.name, {}) == s.default
    assert settings_table.env(s.name, {s.env: ""}) == s.default      # empty is unset
    assert settings_table.env(s.name, {s.env: s.text(_sample(s))}) == _sample(s)
    bad = _outside(s) or ("maybe" if s.type is bool else "x" if s.type is not str else None)
    if bad is not None:
        with pytest.raises(BadVariable, match=f"^{s.env}"):
            settings_table.env(s.name, {s.env: bad})


def test_a_bad_variable_is_a_usage_error_and_a_value_error():
    with pytest.raises(ValueError, match="LTP_DEAD_S: cannot read 'soon' as float"):
        settings_table.env("dead_s", {"LTP_DEAD_S": "soon"})
    with pytest.raises(UsageError, match="LTP_TOLERANT must be one of backward, hook, never"):
        settings_table.env("tolerant", {"LTP_TOLERANT": "sometimes"})
    assert BadVariable("x").exit_code == 2
    assert settings_table.env("forkserver", {"LTP_FORKSERVER": "0"}) is False
    assert settings_table.env("servers", {"LTP_SERVERS": "3"}) == 3


@pytest.mark.unit
def test_the_dataplanes_cache_variable_is_the_tables():
    """dataplane/xdp/bpfcache.py spells LTP_CACHE_DIR and its default itself
    (the dataplane imports nothing of control): they are the table's."""
    from ltpx.dataplane.xdp import bpfcache
    table = TABLE["cache_dir"]
    assert table.env == bpfcache.ENV and table.default == bpfcache.DEFAULT_DIR
