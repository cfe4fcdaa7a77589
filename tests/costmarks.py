# SPDX-License-Identifier: Apache-2.0
"""Tests by cost: every test says what it needs, so the fast part runs alone.

  unit   quick, and no root, no rig, no bcc compile: `pytest -m unit` runs as
         any user in well under a minute
  root   needs root: BPF (bcc, BPF_PROG_TEST_RUN, pins), or a TCP congestion
         control other than the ones net.ipv4.tcp_allowed_congestion_control
         lets any user set (a TCP job's default, cubic); skips, saying so, when
         pytest runs as another user
  rig    builds network namespaces (and so needs root too: it counts as root)
  slow   more than ~5 s on a 2-core machine; alone, a test that
         needs no privilege but is no quick unit (a wheel built, a job of
         processes on loopback)

As any user, plain `pytest` runs the unit and unprivileged slow tests and
skips the rest. A test with none of them is an error at collection, naming
the test and the markers to choose from. Loaded by tests/conftest.py.
"""
from __future__ import annotations

import os

import pytest

COST = ("unit", "root", "rig", "slow")
MARKERS = {
    "unit": "no root, no rig, no bcc compile (`pytest -m unit` runs unprivileged)",
    "root": "needs root: BPF, or a TCP congestion control only root may set (skips otherwise)",
    "rig": "builds network namespaces (implies root)",
    "slow": "more than ~5 s on a 2-core machine (alone: unprivileged, not quick)",
}


def pytest_configure(config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def pytest_collection_modifyitems(config, items) -> None:
    bare = []
    not_root = os.geteuid() != 0
    for item in items:
        if item.get_closest_marker("rig") and not item.get_closest_marker("root"):
            item.add_marker(pytest.mark.root)
        if not_root and item.get_closest_marker("root"):
            item.add_marker(pytest.mark.skip(reason="needs root (marked root or rig): run as root"))
        if not any(item.get_closest_marker(m) for m in COST):
            bare.append(item.nodeid)
    if bare:
        raise pytest.UsageError(
            "tests without a cost marker (pytest.mark.unit, .root, .rig or .slow; see "
            "tests/costmarks.py):\n  " + "\n  ".join(bare))
