"""`python -m ltpx.control.training`: one training rank (see rank.py)."""
import sys

from .rank import main

sys.exit(main())
