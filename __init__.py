"""LTP: a loss-tolerant gradient transport whose receive path runs in XDP.

Parts: ``ltpx.dataplane`` (BPF programs, maps, wire format), ``ltpx.control``
(rounds, Early Close, Bubble Filling, rate control), ``ltpx.tools`` (the
``ltp`` command). The BPF C sources live in ``bpf/`` beside this file.
"""
from pathlib import Path

__version__ = "0.1.0"

BPF_DIR = Path(__file__).resolve().parent / "bpf"
