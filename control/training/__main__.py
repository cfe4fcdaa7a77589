# SPDX-License-Identifier: Apache-2.0
"""`python -m ltpx.control.training`: one training rank (see rank.py)."""
from .rank import run_main

run_main()
