# SPDX-License-Identifier: Apache-2.0
"""How a float32 buffer is cut into chunks: whole elements, fixed size.

Every chunk but the last holds exactly chunk_bytes; the last holds the rest.
A float is never split across packets, so a lost chunk is a hole of whole
elements that Bubble Filling can fill.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...dataplane.xdp.wire import CHUNK_BYTES, HDR_LEN

ELEM = 4  # bytes per float32
# what a chunk costs on the wire besides its payload: Ethernet, IPv4, UDP and
# LTP headers (the capacity a receiver divides is counted in these bytes too)
FRAME_OVERHEAD = 14 + 20 + 8 + HDR_LEN


@dataclass(frozen=True)
class ChunkLayout:
    nelems: int
    chunk_bytes: int = CHUNK_BYTES

    def __post_init__(self) -> None:
        if self.nelems < 1:
            raise ValueError(f"a round needs at least one element, got {self.nelems}")
        if self.chunk_bytes % ELEM or self.chunk_bytes < ELEM:
            raise ValueError(f"chunk_bytes must be a positive multiple of {ELEM}")

    @property
    def chunk_elems(self) -> int:
        return self.chunk_bytes // ELEM

    @property
    def nbytes(self) -> int:
        return self.nelems * ELEM

    @property
    def nchunks(self) -> int:
        return -(-self.nelems // self.chunk_elems)

    @property
    def last_len(self) -> int:
        """Payload bytes of the last chunk."""
        return self.nbytes - (self.nchunks - 1) * self.chunk_bytes

    def chunk_len(self, c: int) -> int:
        return self.last_len if c == self.nchunks - 1 else self.chunk_bytes

    def elem_range(self, c: int) -> tuple[int, int]:
        lo = c * self.chunk_elems
        return lo, min(lo + self.chunk_elems, self.nelems)

    def elem_mask(self, chunk_mask: np.ndarray) -> np.ndarray:
        """bool per element from bool per chunk."""
        return np.repeat(np.asarray(chunk_mask, dtype=bool), self.chunk_elems)[:self.nelems]


def as_f32(buf, nelems: int | None = None) -> np.ndarray:
    """Validate a gradient buffer: a C-contiguous 1-D float32 array (a torch
    tensor is accepted through .numpy()). Raises TypeError/ValueError naming
    what is wrong."""
    if hasattr(buf, "detach") and hasattr(buf, "numpy"):
        buf = buf.detach().cpu().numpy()
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"expected a numpy float32 array or a torch tensor, got {type(buf).__name__}")
    if buf.dtype != np.float32:
        raise TypeError(f"expected float32 elements, got {buf.dtype}")
    if buf.ndim != 1:
        buf = buf.reshape(-1)
    if nelems is not None and buf.size != nelems:
        raise ValueError(f"expected {nelems} elements, got {buf.size}")
    return np.ascontiguousarray(buf)
