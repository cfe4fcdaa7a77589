# SPDX-License-Identifier: Apache-2.0
"""ltpx.torch: the Horovod/BytePS-shaped training API (ltpx.control.torchapi, re-exported)."""
from ltpx.control.torchapi import *  # noqa: F401,F403
from ltpx.control.torchapi import __all__, __doc__  # noqa: F401
