#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Set up, then run the test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
