#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Set up everything LTP needs on a fresh Debian machine. Safe to run twice:
# each step checks first and does nothing when already done.
#   - Debian packages: bcc (python3-bpfcc), clang, kernel headers, iproute2, ...
#   - .venv made with /usr/bin/python3 --system-site-packages (bcc is a Debian
#     package, not on the package index), torch==2.13.0 (CPU build), this package
#   - kernel-headers link and bpffs mount (`ltp doctor --fix`)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "setup needs root (apt-get, BPF, network namespaces): run it with sudo" >&2
    exit 1
fi

# python3-cryptography: Ed25519 for signed answers (control/transport/signing.py)
# tshark: decodes `ltp capture` files with tools/wireshark/ltp.lua (tests/test_capture.py runs it)
PKGS="python3-bpfcc python3-cryptography python3-venv python3-dev clang iproute2 ethtool kmod libbpf1 linux-headers-amd64 tshark"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "setup: installing Debian packages:$missing" >&2
    # tshark's package asks whether non-root users may capture: no, and no prompt
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv (system site packages, for bcc)" >&2
    /usr/bin/python3 -m venv --system-site-packages .venv
fi

stamp=.venv/.ltp-installed
want="$(sha256sum pyproject.toml | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! .venv/bin/python -c "import ltpx, torch" 2>/dev/null; then
    echo "setup: installing torch==2.13.0 and ltpx into .venv" >&2
    .venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
    .venv/bin/pip install -q --disable-pip-version-check -e '.[train,plot,dev,integrations]'
    echo "$want" > "$stamp"
fi

# Kernel headers link (Debian's -amd64/-common dirs when the running kernel
# has none) and the bpffs mount.
if ! .venv/bin/ltp doctor --fix --no-load >/dev/null; then
    .venv/bin/ltp doctor --no-load >&2
    exit 1
fi
