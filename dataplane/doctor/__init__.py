# SPDX-License-Identifier: Apache-2.0
"""`ltp doctor`: can this machine run LTP's dataplane, and the fixes for what
is missing. It sits above both `xdp` (it loads the program) and `rig` (the
ACK-clock check builds a veth pair of its own).

- checks.py: the checks (root, bcc, kernel, headers, bpffs, libbpf, a real
  load, the compile cache) and `fix()`
- growcheck.py: does a frame grow on a veth device (the ACK clock)
"""
