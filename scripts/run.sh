#!/usr/bin/env bash
# The main job on the built-in default: set up, then push a 1 MiB tensor through
# the XDP dataplane on a veth pair in two namespaces and show what arrived.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/ltp demo "$@"
