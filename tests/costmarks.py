# SPDX-License-Identifier: Apache-2.0
"""Tests by cost: every test says what it needs, so the fast part runs alone.

  unit   quick, and no root, no rig, no bcc compile: `pytest -m unit` runs as
         any user in well under a minute
  root   needs root, bcc and a BPF-capable kernel (BPF_PROG_TEST_RUN, pins)
  rig    builds network namespaces (and so needs root too: it counts as root)
  slow   more than a few seconds on a 2-core machine; alone, a test that
         needs no privilege but is no quick unit (a wheel built, a job of
         processes on loopback)

A test with none of them is an error at collection, naming the test and the
markers to choose from. Loaded by tests/conftest.py.
"""
from __future__ import annotations

import pytest

COST = ("unit", "root", "rig", "slow")
MARKERS = {
    "unit": "no root, no rig, no bcc compile (`pytest -m unit` runs unprivileged)",
    "root": "needs root, bcc and a BPF-capable kernel (skips with a reason otherwise)",
    "rig": "builds network namespaces (implies root)",
    "slow": "more than a few seconds on a 2-core machine (alone: unprivileged, not quick)",
}


def pytest_configure(config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def pytest_collection_modifyitems(config, items) -> None:
    bare = []
    for item in items:
        if item.get_closest_marker("rig") and not item.get_closest_marker("root"):
            item.add_marker(pytest.mark.root)
        if not any(item.get_closest_marker(m) for m in COST):
            bare.append(item.nodeid)
    if bare:
        raise pytest.UsageError(
            "tests without a cost marker (pytest.mark.unit, .root, .rig or .slow; see "
            "tests/costmarks.py):\n  " + "\n  ".join(bare))
