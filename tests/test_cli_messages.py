# SPDX-License-Identifier: Apache-2.0
"""What a newcomer's typo meets (issue 25, item 8): "did you mean" for a
mistyped flag, subcommand or choice, reported by the subcommand that was
meant; size and rate errors whose examples are values that parse."""
from __future__ import annotations

import json
import re

import pytest

from ltp_cli import ltp
from ltpx.tools.common import UsageError, parse_rate, parse_size

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("argv, prog, hint", [
    (["train", "--wrokers", "3"], "ltp train", "--workers"),
    (["rig", "up", "--wrokers=3"], "ltp rig up", "--workers"),
    (["trian"], "ltp", "train"),
    (["train", "--transport", "tpc"], "ltp train", "tcp"),
])
def test_a_typo_is_a_usage_error_that_names_what_was_meant(argv, prog, hint):
    p = ltp(*argv, rc=2)
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{prog}: error:") and f"did you mean {hint}?" in last, p.stderr
    assert p.stderr.startswith(f"usage: {prog} "), p.stderr      # the meant command's usage
    j = json.loads(ltp(*argv, "-j", rc=2).stdout)
    assert j["exit_code"] == 2 and f"did you mean {hint}?" in j["error"]


def test_an_unknown_flag_far_from_any_gets_no_guess():
    p = ltp("train", "--xyz", rc=2)
    assert "unrecognized arguments: --xyz" in p.stderr and "did you mean" not in p.stderr


@pytest.mark.parametrize("parse, flag, bad", [(parse_rate, "--rate", "abc"),
                                              (parse_size, "--buffer", "3q")])
def test_the_examples_in_a_unit_error_are_values_that_parse(parse, flag, bad):
    with pytest.raises(UsageError) as e:
        parse(bad, flag)
    examples = re.search(r"e\.g\. ([^;]+);", str(e.value)).group(1).split(", ")
    assert len(examples) >= 3
    for ex in examples:
        assert parse(ex, flag) > 0
