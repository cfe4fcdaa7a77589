# SPDX-License-Identifier: Apache-2.0
"""What the star rig (star.py) and the leaf-spine rig (leafspine.py) share:
the config's name and TBF fields and their checks (`ShapedConfig`), the end
host record (`Host`), RigError, the root check, and the lifecycle in
`RigBase`: `with` builds a rig and always removes it, `up()` builds one that
stays (and removes what it built if building fails), `down()` and
`destroy(name)` remove (signals wait meanwhile: signals.py), `attach(name)`
reconnects through the state file. A subclass says where its state and pins
live and how it is built and removed."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Self

from .. import netns
from . import signals, tcprogs
from ...errors import RigError

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_]{0,11}$")   # rig names: namespaces stay short
MAX_RATE_BPS = 32 * 10**9  # TBF's 32-bit byte rate (pyroute2 sends no TCA_TBF_RATE64)
MIN_RATE_BPS = 64_000


def _check_root(what: str) -> None:
    if os.geteuid() != 0:
        raise RigError(f"{what} needs root (CAP_NET_ADMIN, CAP_BPF, CAP_SYS_ADMIN): run it with sudo")


# --------------------------------------------------------------------------- config

class ShapedConfig:
    """What both rig configs (frozen dataclasses) share: a name, the TBF of
    their shaped links (rate, buffer, bucket), the MTU and the XDP mode; the
    checks of those fields; the state-file form."""

    name: str
    rate_bps: int
    buffer_bytes: int
    burst_bytes: int | None
    mode: str
    mtu: int

    @property
    def burst(self) -> int:
        """The TBF bucket in bytes (explicit, or max(2 frames, 80 us at the rate))."""
        if self.burst_bytes is not None:
            return self.burst_bytes
        return max(2 * (self.mtu + 14), int(self.rate_bps / 8 * 80e-6))

    def check_shaping(self) -> None:
        """Raise ValueError naming the field when name, rate, buffer, burst,
        mode or mtu is out of range."""
        if not isinstance(self.name, str) or not NAME_RE.match(self.name):
            raise ValueError(f"name: {self.name!r} must be 1-12 characters of a-z, 0-9, _ "
                             "(starting with a letter or digit)")
        if not MIN_RATE_BPS <= self.rate_bps <= MAX_RATE_BPS:
            raise ValueError(f"rate: must be in {MIN_RATE_BPS // 1000}kbit..."
                             f"{MAX_RATE_BPS // 10**9}gbit, got {self.rate_bps} bit/s")
        frame = self.mtu + 14
        if not frame <= self.buffer_bytes <= 1 << 30:
            raise ValueError(f"buffer: must hold at least one frame ({frame} bytes) and at "
                             f"most 1 GiB, got {self.buffer_bytes} bytes")
        if self.burst_bytes is not None and not frame <= self.burst_bytes <= 1 << 30:
            raise ValueError(f"burst: must be at least one frame ({frame} bytes), "
                             f"got {self.burst_bytes}")
        if self.mode not in ("native", "skb"):
            raise ValueError(f"mode: must be native or skb, got {self.mode!r}")
        if not 1280 <= self.mtu <= 3500:
            raise ValueError(f"mtu: must be in 1280..3500 (native XDP on veth), got {self.mtu}")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "burst_bytes": self.burst}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclasses.dataclass(frozen=True)
class Host:
    """One end host of a rig.

    name: "ps" or "w<i>" (leaf-spine: "j<job>ps", "j<job>w<i>"); role: "ps" or
    "worker"; index: worker id (-1 on the PS); netns: its namespace;
    ifname/mac/ip: its veth end; port: the veth on the switch (leaf) side
    that leads to it."""

    name: str
    role: str
    index: int
    netns: str
    ifname: str
    ip: str
    mac: str
    port: str
    prefixlen: int = 24

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- the lifecycle

def saved_names(state_dir: str) -> set[str]:
    """Names of the rigs that have a state file (<name>.json) in `state_dir`."""
    with contextlib.suppress(FileNotFoundError):
        return {f[:-5] for f in os.listdir(state_dir) if f.endswith(".json")}
    return set()


class RigBase:
    """The lifecycle of a named rig, shared by `star.Rig` and
    `leafspine.LeafSpine`. A subclass sets the class attributes below, builds
    in `_build` (saving the state file first, ending with `_built()`) and
    removes in `_remove`. The state file holds the owner's pid: `up()` removes
    a rig whose `with` process died before building one of the same name."""

    _KIND: ClassVar[str]            # what errors call it: "rig", "leaf-spine rig"
    _UP_HINT: ClassVar[str]         # the command that builds one
    _CONFIG: ClassVar[Any]          # its config class (with from_dict)
    config: Any

    def __init__(self) -> None:
        self.owned = True           # __exit__ tears down
        self._fds: dict[str, int] = {}
        self._is_up = False
        self._owner_pid = os.getpid()     # fork detection: only this process tears down
        self._transient = False     # built by `with`: removed when its owner leaves the block
        self.owner_pid: int | None = None  # saved in the state: a live owner keeps `down --all` off

    @property
    def name(self) -> str:
        return self.config.name

    # ---- what a subclass provides
    @property
    def namespaces(self) -> list[str]:
        raise NotImplementedError

    @property
    def pins(self) -> dict[str, str]:
        """"dir": the rig's pin folder, and a path in it per pinned map or program."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """The description saved as the state file (with "owner_pid": self.owner_pid)."""
        raise NotImplementedError

    def _build(self) -> None:
        raise NotImplementedError

    @staticmethod
    def _state_path(name: str) -> str:
        raise NotImplementedError

    @staticmethod
    def _pin_dir(name: str) -> str:
        raise NotImplementedError

    @staticmethod
    def _found_namespaces(name: str) -> list[str]:
        """Namespaces of rig `name` that are on this machine now."""
        raise NotImplementedError

    @staticmethod
    def _saved() -> set[str]:
        """Names of this kind's rigs with a state file (whose owner up() may judge)."""
        return set()

    @staticmethod
    def _remove(name: str, namespaces: Sequence[str] = ()) -> None:
        """Remove everything rig `name` may have, complete or not (`namespaces`:
        the ones it is known to have); raise one RigError listing what failed."""
        raise NotImplementedError

    #: what the rig is called in messages, and the command that removes one
    KIND = "rig"
    DOWN = "ltp rig down"

    @classmethod
    def _exists_error(cls, name: str) -> str:
        """The message when `up` finds a rig `name` there already."""
        return (f"a {cls.KIND} named {name!r} exists already: use it (--name {name}), "
                f"pick another name, or `{cls.DOWN} --name {name}`")

    @classmethod
    def _incomplete_error(cls, name: str, missing: list[str]) -> str:
        """The message when `attach` finds namespaces of rig `name` missing."""
        return (f"{cls.KIND} {name!r} is incomplete (missing namespaces: "
                f"{', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); "
                f"`{cls.DOWN} --name {name}` removes what is left")

    # ---- the owner: the process building the rig, or inside its `with` block
    @classmethod
    def _owner_of(cls, name: str) -> tuple[int | None, bool]:
        """(owner pid from rig `name`'s state, whether that process is alive);
        this process never counts as another owner."""
        try:
            with open(cls._state_path(name)) as f:
                pid = json.load(f).get("owner_pid")
        except (OSError, ValueError):
            return None, False
        if not pid or pid == os.getpid():
            return None, False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid, False
        except PermissionError:
            pass
        return pid, True

    @classmethod
    def _owner_died(cls, name: str) -> bool:
        """Was rig `name` made by a `with` block whose process is gone?"""
        pid, alive = cls._owner_of(name)
        return pid is not None and not alive

    @classmethod
    def owner(cls, name: str) -> int | None:
        """The pid of the live process that owns rig `name` (one being built,
        or one made by `with ...`), or None (a persistent rig from `up()`,
        a leftover, or an owner that is gone)."""
        pid, alive = cls._owner_of(name)
        return pid if alive else None

    def _clear_orphan(self) -> None:
        """Before building: remove a rig of this name that no one will remove
        (left by a `with` block whose process was killed), and any other rig
        whose state names such an owner: a killed owner cannot take its rig
        down, so the next rig built does. A rig being built, or of a live
        owner, or persistent (`ltp rig up`: no owner) is left alone."""
        if self.exists(self.name) and self._owner_died(self.name):
            self.destroy(self.name)
        for name in sorted(self._saved() - {self.name}):
            if self._owner_died(name):
                try:
                    self.destroy(name)
                except (RigError, OSError) as e:   # another builder's sweep got there first
                    log.info("ltpx: left rig %s (its owner is gone) for later: %s", name, e)

    def _set_owner(self, pid: int | None) -> None:
        """Note the process building the rig (None: building failed)."""
        self.owner_pid = pid

    def _built(self) -> None:
        """The last step of `_build`: the rig is up; a persistent one (`up()`
        outside `with`) has no owner; save the state."""
        self._is_up = True
        if not self._transient:
            self.owner_pid = None     # a persistent rig (`ltp rig up`) has no owner
        self._save()

    # ---- hooks
    def _restore(self, state: dict[str, Any]) -> None:
        """On attach: take what the state file holds besides the config."""
        self.owner_pid = state.get("owner_pid")

    @classmethod
    def _saved_namespaces(cls, name: str) -> list[str]:
        """Namespaces the state file of rig `name` lists (for destroy)."""
        return []

    def _observations(self) -> dict[str, Callable[[], Any]]:
        """What `status()` reads besides the description: key -> reader."""
        return {}

    # ---- lifecycle
    def __enter__(self) -> Self:
        if not self._is_up:
            self._transient = True
            self.up()
        self._owner_pid = os.getpid()
        self._sigterm = signals.sigterm_as_exit()
        self._sigterm.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if os.getpid() != self._owner_pid:
            return      # a forked child unwinding the parent's `with`: not ours to remove
        try:
            self._sigterm.__exit__(None, None, None)
        finally:
            if self.owned:
                self.down()
            else:
                self.close()

    def up(self) -> Self:
        """Build the rig; on any failure (or Ctrl-C) remove what was built."""
        _check_root(f"building a {self._KIND}")
        self._clear_orphan()
        if self.exists(self.name):
            raise RigError(self._exists_error(self.name))
        pid = self._owner_pid = os.getpid()
        self._set_owner(pid)
        try:
            with signals.sigterm_as_exit():
                self._build()
        except BaseException:
            self._is_up = False
            self._set_owner(None)
            if os.getpid() == pid:       # not in a forked helper unwinding our stack
                with signals.deferred_signals():
                    self._remove(self.name, self.namespaces)
            raise
        return self

    def _save(self) -> None:
        path = self._state_path(self.name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
        os.replace(tmp, path)

    def down(self) -> None:
        """Remove the rig: its namespaces (with their veths, qdiscs, XDP and tc
        programs), the pinned maps and the state file. Idempotent; Ctrl-C and
        SIGTERM wait until it is done."""
        with signals.deferred_signals():
            self.close()
            self._remove(self.name, self.namespaces)
            self._is_up = False

    def _map_fd(self, key: str) -> int:
        """fd of the pinned map self.pins[key], opened once (close() closes it)."""
        if key not in self._fds:
            self._fds[key] = tcprogs.open_pinned(
                self.pins[key], f"is the {self._KIND} {self.name} up? `{self._UP_HINT}`")
        return self._fds[key]

    def status(self) -> dict[str, Any]:
        """The description, whether its namespaces are all there, and each of
        `_observations()` (a reader that fails gives {"error": ...}: status
        reports a broken rig, it does not fail on one)."""
        d = self.to_dict()
        d["namespaces_present"] = all(netns.exists(ns) for ns in self.namespaces)
        for key, read in self._observations().items():
            try:
                d[key] = read()
            except Exception as e:  # noqa: BLE001 - report, do not fail status
                d[key] = {"error": str(e)}
        return d

    def close(self) -> None:
        """Drop this object's map fds (the rig stays)."""
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    # ---- reconnecting
    @classmethod
    def _read_state(cls, name: str) -> dict[str, Any]:
        try:
            with open(cls._state_path(name)) as f:
                return json.load(f)
        except FileNotFoundError:
            raise RigError(f"no {cls._KIND} named {name!r} (no {cls._state_path(name)}); "
                           f"`{cls._UP_HINT}` builds one") from None

    @classmethod
    def attach(cls, name: str) -> Self:
        """The existing rig `name`, from its state file."""
        st = cls._read_state(name)
        rig = cls(cls._CONFIG.from_dict(st["config"]))
        rig.owned = False
        rig._is_up = True
        rig._restore(st)
        missing = [ns for ns in rig.namespaces if not netns.exists(ns)]
        if missing:
            raise RigError(cls._incomplete_error(name, missing))
        return rig

    @classmethod
    def exists(cls, name: str) -> bool:
        return (os.path.exists(cls._state_path(name)) or os.path.exists(cls._pin_dir(name))
                or bool(cls._found_namespaces(name)))

    @classmethod
    def destroy(cls, name: str) -> bool:
        """Tear down rig `name` (complete or not); False if nothing was there."""
        _check_root(f"removing a {cls._KIND}")
        if not cls.exists(name):
            return False
        namespaces = cls._saved_namespaces(name)
        with signals.deferred_signals():
            cls._remove(name, namespaces)
        return True
