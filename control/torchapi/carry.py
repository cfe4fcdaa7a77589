# SPDX-License-Identifier: Apache-2.0
"""A worker's side of the loss policy's wire (losspolicy.py, "The wire").

Under compress auto the server may choose bfloat16 for float32 gradients
on a lossy path; the step ops then say so (Op.wire, Op.carry). A worker's
link sends such a piece as it is (codec.WorkerCodec, keep_error off under
auto: it keeps no error), so the rounding is taken here, per piece:

- while the ops carry, what rounding leaves out of a piece is kept and
  added to the same piece's next gradient (error feedback, as compress
  bf16 does);
- on the first float32 step after, what is still kept is added once and
  dropped: nothing a gradient held is lost across a switch, and nothing
  is kept while the wire is exact.

GradientSync (gradsync.py) keys its pieces by bucket, DDP's TolerantReduce
(ddp.py) by its bucket's memory.
"""
from __future__ import annotations

import numpy as np
import torch

WIRE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def rounding_error(x: np.ndarray, wire: str, out: np.ndarray) -> None:
    """out = x - x as the 2-byte `wire` (bf16 or fp16) holds it, zero where x
    is not finite. codec.Half.encode rounds alike (torch's conversion)."""
    src, res = torch.from_numpy(x), torch.from_numpy(out)
    res.copy_(src.to(WIRE_DTYPES[wire]))
    torch.sub(src, res, out=res)
    res.nan_to_num_(0.0, 0.0, 0.0)


class Carry:
    """The rounding error of each piece a worker pushes under the loss
    policy's wire (see the module). `keep`: error feedback is on (the
    optimizer's setting); off, the pieces are rounded and nothing is kept."""

    def __init__(self, keep: bool = True):
        self.keep = keep
        self.held: dict = {}        # piece key -> float32 error, the piece's length

    def into(self, key, piece: np.ndarray, op) -> None:
        """Before piece (float32, pushed under `op`) goes: what it carries
        added to it; under op.carry its new rounding error kept, else none."""
        res = self.held.get(key)
        if res is not None:
            piece += res
        if op.carry and self.keep:
            if res is None:
                res = self.held[key] = np.empty_like(piece)
            rounding_error(piece, op.wire, res)
        elif res is not None:
            del self.held[key]

    def __len__(self) -> int:
        return len(self.held)
