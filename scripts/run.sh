#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job on the built-in default: set up, then train the built-in MLP on
# scikit-learn's digits over LTP (XDP receive path, 1% injected loss) on a
# network-namespace rig, and the same parameter server over TCP beside it, and
# print the comparison. Extra arguments go to `ltp train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/ltp train --compare tcp --loss 0.01 "$@"
