# SPDX-License-Identifier: Apache-2.0
"""Input bounds a value could slip past (issue 26): the training flags' learning
rate and momentum (nan passes no comparison, inf every lower bound) and the
heartbeat limit an endpoint writes into its XDP program (ltp_cfg.limit_ns,
compared there as a signed 64-bit count). The float settings of the
settings table are checked in test_settings_table.py."""
from __future__ import annotations

import pytest

from conftest import requires_bpf


@pytest.mark.unit
@pytest.mark.parametrize("argv", [["--lr", "inf"], ["--lr", "nan"], ["--lr", "0"], ["--lr=-1"],
                                  ["--momentum", "nan"], ["--momentum", "inf"],
                                  ["--momentum=-0.1"], ["--deadline-min", "inf"]])
def test_a_ranks_learning_rate_and_momentum_are_finite_or_a_usage_error(argv, capsys):
    from ltpx.control.training.rank import main
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert f"{argv[0].split('=')[0]}: must be a finite number" in capsys.readouterr().err


@pytest.mark.unit
def test_a_job_config_with_a_non_finite_learning_rate_is_refused():
    """The launcher hands ranks the config as JSON (--config): validate() checks it too."""
    from ltpx.control.training.config import TrainConfig
    TrainConfig(lr=0.05, momentum=0.0).validate()
    for lr, momentum in ((float("inf"), 0.9), (float("nan"), 0.9), (0.1, float("nan")),
                         (0.1, -1.0)):
        with pytest.raises(ValueError, match="lr, momentum"):
            TrainConfig(lr=lr, momentum=momentum).validate()


@pytest.mark.unit
def test_a_heartbeat_limit_is_what_the_programs_signed_compare_holds():
    """9.3e9 s is 9.3e18 ns, beyond 2^63 - 1: the program would read it as a
    negative limit, every round stale, nothing ACKed. Refused instead."""
    from ltpx.dataplane.xdp.maps import MAX_LIVENESS_S, liveness_ns
    assert liveness_ns(None) == liveness_ns(0) == 0
    assert liveness_ns(1.5) == 1_500_000_000
    assert 0 < liveness_ns(MAX_LIVENESS_S) <= 2**63 - 1
    for bad in (9.3e9, float("inf"), float("nan"), -1.0):
        with pytest.raises(ValueError, match="liveness limit must be in 0..9.2e"):
            liveness_ns(bad)


@pytest.mark.root
@requires_bpf
def test_a_loaded_program_keeps_its_limit_when_a_longer_one_is_refused(small_geometry):
    from ltpx.dataplane.xdp.loader import Dataplane
    with Dataplane(small_geometry) as dp:
        maps = dp.maps()
        if maps.live is None:
            pytest.skip("this program's ltp_cfg is not mmapable")
        maps.set_liveness(2.0)
        with pytest.raises(ValueError, match="liveness limit"):
            maps.set_liveness(9.3e9)
        assert int(maps.live[1]) == 2_000_000_000
