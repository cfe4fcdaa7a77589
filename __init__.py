# SPDX-License-Identifier: Apache-2.0
"""LTP: a loss-tolerant gradient transport whose receive path runs in XDP.

Parts: ``ltpx.dataplane`` (BPF programs, maps, wire format), ``ltpx.control``
(rounds, Early Close, Bubble Filling, rate control, training), ``ltpx.tools``
(the ``ltp`` command), and ``ltpx.torch``, the training API; ``ltpx.errors``
holds the one error root (``LtpError``) and its kinds. The BPF C sources
live in ``bpf/`` beside this file.
"""
from pathlib import Path

__version__ = "0.1.0"

BPF_DIR = Path(__file__).resolve().parent / "bpf"

# ltpx.torch is ltpx.control.torchapi under its public name. The name is a
# package `torch` in control/torchapi/alias/, a folder added to this
# package's search path only: a torch/ at the root would shadow PyTorch
# whenever the root is on sys.path (as under pytest), and a folder on
# __path__ is found the same way from the source tree, an editable install
# and a wheel.
# pytest also imports this file as a plain module (named `__init__`) when the
# checkout's folder name is not an identifier; such a module has no __path__.
if "__path__" in globals():
    __path__.append(str(Path(__file__).parent / "control" / "torchapi" / "alias"))
