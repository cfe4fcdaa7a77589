# SPDX-License-Identifier: Apache-2.0
"""8-bit min-max compression of gradients (BAGUA's MinMaxUInt8), loss-tolerant per chunk.

A float32 vector of n elements is cut into pieces of `per_chunk` elements
(the LTP chunk size less an 8-byte head), each encoded on its own:

    | base (float32) | scale (float32) | code (uint8) x per_chunk |   x ~ base + code * scale

so every encoded piece is exactly one LTP chunk of the round that carries
it (the last piece is shorter: its codes padded with zeros to whole 4-byte
words), and a lost chunk costs only its own elements: the receiver decodes
what arrived and Bubble-Fills the decoded values. Rounding is to the
nearest code, so an element is off by at most scale / 2 (plus float32
rounding of base + code * scale). base is the piece's min and scale
(max - min) / 255, except for a piece with min <= 0 <= max: there scale is
(max - min) / 254 and base = -z * scale for a whole z, so a zero decodes as
exactly zero (an unused parameter's gradient stays zero). A piece whose
elements are all equal has scale 0 and decodes exactly. A piece holding a NaN or an infinity is sent
as min = scale = NaN and decodes to NaN in every element: a non-finite
gradient stays visible in the aggregate (as it is in float32, so overflow
checks such as GradScaler's still see it), only spread over its piece.

The encoded vector is handled as float32 words (the transports move
float32 buffers): `words(n)` of them. Encoding and decoding are numpy
passes over all pieces at once, one for the whole pieces and one for the
last; nothing loops over elements or chunks in Python.
"""
from __future__ import annotations

import numpy as np
import torch

from ...errors import UsageError
from ..transport.bubble import fill
from .ops import WIRES
from ..settings_table import EXACT_COMPRESS

HEAD = 8          # bytes before a piece's codes: base and scale, float32 little-endian
HEAD_WORDS = HEAD // 4
LEVELS = 255


class MinMaxUInt8:
    """The codec for one chunk size (the LTP chunk the pieces must fill)."""

    name = "uint8"

    def __init__(self, chunk_bytes: int):
        if chunk_bytes % 4 or chunk_bytes <= HEAD:
            raise ValueError(f"chunk_bytes must be a multiple of 4 above {HEAD}, got {chunk_bytes}")
        self.chunk_bytes = chunk_bytes
        self.chunk_words = chunk_bytes // 4
        self.per_chunk = chunk_bytes - HEAD          # elements (codes) per whole piece

    # ------------------------------------------------------------------ sizes
    def chunks(self, n: int) -> int:
        return max(1, -(-n // self.per_chunk))

    def split(self, n: int) -> tuple[int, int]:
        """(whole pieces, elements of the last piece)."""
        c = self.chunks(n)
        return c - 1, n - (c - 1) * self.per_chunk

    def words(self, n: int) -> int:
        """float32 words the encoding of n elements takes."""
        full, last = self.split(n)
        return full * self.chunk_words + HEAD_WORDS + -(-last // 4)

    def decoded_span(self, n: int) -> int:
        """Elements of a padded decode buffer: whole pieces of n (chunks x per_chunk)."""
        return self.chunks(n) * self.per_chunk

    # ------------------------------------------------------------------ encode
    def encode(self, x: np.ndarray, out: np.ndarray, residual: np.ndarray | None = None) -> None:
        """Encode float32 x [n] into out (float32 [words(n)]). With `residual`
        ([n] float32), write x - decode(encode(x)) there (error feedback;
        zero where a piece was not finite)."""
        n = x.shape[-1]
        full, last = self.split(n)
        q, cw = self.per_chunk, self.chunk_words
        cut = full * q
        with np.errstate(over="ignore", invalid="ignore"):
            if full:
                self._encode_rows(rows(x[:cut], full, q), rows(out[:full * cw], full, cw),
                                  None if residual is None else rows(residual[:cut], full, q))
            self._encode_rows(rows(x[cut:], 1, last), rows(out[full * cw:self.words(n)], 1, -1),
                              None if residual is None else rows(residual[cut:], 1, last))

    @staticmethod
    def _encode_rows(x: np.ndarray, w: np.ndarray, residual: np.ndarray | None) -> None:
        """Pieces x [R, L] into words w [R, HEAD_WORDS + ceil(L/4)]."""
        L = x.shape[1]
        mn, mx = x.min(axis=1), x.max(axis=1)                   # NaN propagates
        ok = np.isfinite(mn) & np.isfinite(mx)
        # a piece spanning 0 gets a grid through 0 (zero stays exactly zero:
        # an unused parameter's gradient, padding), one step finer to keep
        # its ends within half a step
        zero = ok & (mn <= 0) & (mx >= 0)
        span = mx.astype(np.float64) - mn
        scale = (span / np.where(zero, LEVELS - 1, LEVELS)).astype(np.float32)
        pos = ok & (scale > 0)
        inv = np.divide(np.float32(1), scale, out=np.zeros_like(scale), where=pos)
        zp = np.where(zero & pos, np.rint(-mn * inv), np.float32(0))
        base = np.where(zero & pos, -(zp * scale), np.where(ok, mn, np.float32(np.nan)))
        t = x - np.where(ok, base, 0)[:, None]
        t *= inv[:, None]
        t[~ok] = 0.0
        np.rint(t, out=t)
        np.clip(t, 0, LEVELS, out=t)
        codes = w[:, HEAD_WORDS:].view(np.uint8)
        codes[:, L:] = 0
        codes[:, :L] = t          # float -> uint8: t is whole numbers in 0..255
        w[:, 0] = base
        w[:, 1] = np.where(ok, scale, np.float32(np.nan))
        if residual is not None:
            dec = codes[:, :L] * w[:, 1:2]
            dec += w[:, 0:1]
            np.subtract(x, dec, out=residual)
            residual[~ok] = 0.0

    # ------------------------------------------------------------------ decode
    def decode(self, enc: np.ndarray, n: int, out: np.ndarray) -> None:
        """Decode rows enc [k, >= words(n)] (float32 words) into out [k, >= n]."""
        full, last = self.split(n)
        q, cw = self.per_chunk, self.chunk_words
        k = enc.shape[0]
        if full:
            self._decode_rows(rows(enc[:, :full * cw], k, full, cw),
                              rows(out[:, :full * q], k, full, q))
        base = full * cw
        self._decode_rows(rows(enc[:, base:base + HEAD_WORDS + -(-last // 4)], k, 1, -1),
                          rows(out[:, full * q:n], k, 1, last))

    @staticmethod
    def _decode_rows(w: np.ndarray, out: np.ndarray) -> None:
        """Words w [k, R, HEAD_WORDS + ...] into out [k, R, L]."""
        L = out.shape[-1]
        codes = w[..., HEAD_WORDS:].view(np.uint8)[..., :L]
        np.multiply(codes, w[..., 1:2], out=out)
        out += w[..., 0:1]


class Half:
    """bfloat16 or float16 on the wire: 2 bytes an element, `per_chunk` of
    them filling an LTP chunk (no head), two to a float32 word.

    bf16 keeps float32's range and 8 bits of its mantissa; it is rounded to
    the nearest, ties to even, and a NaN stays a NaN. fp16 keeps 11 bits of
    mantissa and its range ends at 65504 (beyond it: an infinity, which
    stays visible to an overflow check such as GradScaler's). A gradient
    already of that dtype travels exactly, and the aggregate comes back
    rounded once, as its .grad would hold it anyway."""

    def __init__(self, name: str, chunk_bytes: int):
        if name not in ("bf16", "fp16"):
            raise ValueError(f"a 16-bit codec is bf16 or fp16, got {name!r}")
        if chunk_bytes % 4 or chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be a positive multiple of 4, got {chunk_bytes}")
        self.name, self.chunk_bytes = name, chunk_bytes
        self.per_chunk = chunk_bytes // 2
        self.dtype = torch.bfloat16 if name == "bf16" else torch.float16

    def chunks(self, n: int) -> int:
        return max(1, -(-n // self.per_chunk))

    def words(self, n: int) -> int:
        return -(-n // 2)

    def decoded_span(self, n: int) -> int:
        return self.chunks(n) * self.per_chunk

    def encode(self, x: np.ndarray, out: np.ndarray, residual: np.ndarray | None = None) -> None:
        """float32 x [n] into out (float32 [words(n)]); with `residual`, x -
        decode(encode(x)) there (zero where x is not finite). torch's
        conversions, in place: one pass each way."""
        n = x.shape[-1]
        raw = out[:self.words(n)].view(np.int16)
        raw[n:] = 0
        half = torch.from_numpy(raw[:n]).view(self.dtype)
        src = torch.from_numpy(x)
        half.copy_(src)
        if residual is not None:
            res = torch.from_numpy(residual)
            res.copy_(half)
            torch.sub(src, res, out=res)
            res.nan_to_num_(0.0, 0.0, 0.0)

    def decode(self, enc: np.ndarray, n: int, out: np.ndarray) -> None:
        """Decode rows enc [k, >= words(n)] (float32 words) into out [k, >= n]."""
        raw = enc[:, :self.words(n)].view(np.int16)[:, :n]
        torch.from_numpy(out[:, :n]).copy_(torch.from_numpy(raw).view(self.dtype))


def rows(a: np.ndarray, *shape: int) -> np.ndarray:
    """a reshaped as a view (ValueError rather than a silent copy the writes would miss)."""
    return a.reshape(shape, copy=False)


HALF = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def make_codec(kind: str, chunk_bytes: int) -> MinMaxUInt8 | Half | None:
    """The codec of a wire (Op.wire; None for "none")."""
    if kind not in WIRES:
        raise ValueError(f"a wire is one of {', '.join(WIRES)}, got {kind!r}")
    if kind == "uint8":
        return MinMaxUInt8(chunk_bytes)
    return Half(kind, chunk_bytes) if kind in ("bf16", "fp16") else None


def wire_for(compress: str, dtypes, deferred: bool = False) -> str:
    """What a step op's gradients travel as, from the compress setting and the
    dtypes of the gradients it carries: a setting other than auto rules;
    auto sends gradients that are all bfloat16 (or all float16) as 2 bytes,
    exactly, and anything else as float32. A deferred answer (the server's
    loss_policy defer: `deferred`, from its links) leaves out chunks of the
    float32 aggregate, so then auto is float32 too."""
    if compress != "auto":
        return compress
    kinds = {HALF.get(dt) for dt in dtypes}
    return kinds.pop() if len(kinds) == 1 and None not in kinds and not deferred else "none"


def staged_as_bits(dtype, compress: str, deferred: bool, last: str | None = None) -> bool:
    """Whether a tensor of `dtype` is staged as its 2-byte bits (ddp.py,
    staging.py): its op travels in that dtype: what wire_for gives it alone,
    or `last`, the wire its bucket's op took the step before (none where
    float32 buckets share the op)."""
    own = HALF.get(dtype)
    return own is not None and (last or wire_for(compress, [dtype], deferred)) == own


def deferred_answers(link) -> bool:
    """Whether any server of a worker's link (links.WorkerLink, or a sharded
    one's parts) answers steps tolerantly."""
    return any(part.answers_deferred() for part in link.parts())


class Codecs:
    """The codecs of one chunk size, made at their first use."""

    def __init__(self, chunk_bytes: int):
        self.chunk_bytes = chunk_bytes
        self.made: dict[str, MinMaxUInt8 | Half | None] = {}

    def of(self, wire: str) -> MinMaxUInt8 | Half | None:
        if wire not in self.made:
            self.made[wire] = make_codec(wire, self.chunk_bytes)
        return self.made[wire]


class ServerCodec:
    """A server link's side of compression (link_ltp.py and link_tcp.py alike).

    Uplink: a round opened as tolerable (a step's bucket) with a wire other
    than none (its op's) carries that codec's words; `decode` turns what
    arrived into float32 rows and Bubble-Fills them (mean | zero; "stale" is
    server.py's, on these decoded values).
    Downlink: the answer that follows a step's rounds starts with their
    aggregate, as many elements as those rounds had, and ends with the step's
    report; `answer` encodes that aggregate (with error feedback: what
    rounding left out of one answer is added to the next) and keeps the
    report's words as they are, so every worker decodes the same bytes and
    the replicas stay bit-identical."""

    def __init__(self, chunk_bytes: int, error_feedback: bool = True):
        self.codecs, self.error_feedback = Codecs(chunk_bytes), error_feedback
        self.carry = False     # the step's op carries its rounding (Op.carry: set_carry)
        self.rounds: dict[int, tuple] = {}    # open compressed round -> its elements, codec
        self.pending = 0                      # elements gathered compressed since the last answer
        self.codec: MinMaxUInt8 | Half | None = None   # ... their codec
        self.bufs: dict[tuple, np.ndarray] = {}
        self.residual: dict[tuple, np.ndarray] = {}   # (codec, elements) -> its error
        self.sent: tuple[int, np.ndarray] | None = None   # (answer d, its wire) for a retry

    def buf(self, key, shape) -> np.ndarray:
        b = self.bufs.get(key)
        if b is None or b.shape != shape:
            b = self.bufs[key] = np.zeros(shape, dtype=np.float32)
        return b

    def set_carry(self, carry: bool) -> None:
        """Whether the steps from now on carry their answers' rounding (Op.carry:
        the loss policy's wire) where the setting does not. Back on float32, the
        rounding still held is dropped: at most half a bfloat16 step of one
        aggregate per element, against starting a later lossy spell with it."""
        if self.carry and not carry and not self.error_feedback:
            self.residual.clear()
        self.carry = carry

    def open(self, r: int, nelems: int, reliable: bool, wire: str) -> int:
        """Round r's size on the wire (words when it is compressed)."""
        codec = None if reliable else self.codecs.of(wire)
        if codec is None:
            self.rounds.pop(r, None)
            return nelems
        self.rounds[r] = (nelems, codec)
        return codec.words(nelems)

    def cancel(self, r: int) -> None:
        self.rounds.pop(r, None)

    def compressed(self, r: int) -> MinMaxUInt8 | Half | None:
        """Round r's codec, while it is open compressed."""
        got = self.rounds.get(r)
        return got and got[1]

    def decode(self, r: int, enc: np.ndarray, masks: np.ndarray | None,
               bubble: str) -> np.ndarray:
        """float32 [k, n] rows of round r from its words, holes filled."""
        n, codec = self.rounds.pop(r)
        self.pending += n
        self.codec = codec
        self.sent = None   # a new answer is on its way
        k, c = enc.shape[0], codec.chunks(n)
        out = self.buf(("up", k), (k, c * codec.per_chunk))
        codec.decode(enc, n, out)
        if masks is not None and not masks.all():
            fill(rows(out, k, c, codec.per_chunk), masks,
                 "zero" if bubble == "stale" else bubble)
        return out[:, :n]

    def answer(self, buf: np.ndarray, d: int | None = None) -> np.ndarray:
        """What goes on the wire for the answer `buf` (unchanged when no
        compressed round preceded it). A second call for the same answer d (a
        retry, server.answer_to) gets the same words again: the workers opened
        d for their count, and error feedback must count the answer once."""
        if d is not None and self.sent is not None and self.sent[0] == d:
            return self.sent[1]
        n, self.pending = self.pending, 0
        if n == 0:
            return buf
        codec = self.codec
        words = codec.words(n)
        wire = self.buf("down", (words + len(buf) - n,))
        v = self.buf("ef", (n,))
        np.copyto(v, buf[:n])
        res = None
        if self.error_feedback or self.carry:
            res = self.residual.get((codec.name, n))
            if res is None:
                res = self.residual[(codec.name, n)] = np.zeros(n, dtype=np.float32)
            v += res
        codec.encode(v, wire[:words], residual=res)
        wire[words:] = buf[n:]
        if d is not None:
            self.sent = (d, wire)
        return wire


class WorkerCodec:
    """A worker link's side: a tolerable piece (a step's bucket, or a server's
    slice of it) goes up as words, and its rounding error is left in the
    piece's buffer (the optimizer keeps it for error feedback); which answers
    start with a compressed aggregate, the optimizer says before the step's
    answer round is expected. keep_error False (compress auto: a wire that is
    the gradients' own dtype rounds nothing, and no error is fed back):
    the piece's buffer is left as it was, one pass instead of four."""

    def __init__(self, chunk_bytes: int, keep_error: bool = True):
        self.codecs, self.keep_error = Codecs(chunk_bytes), keep_error
        self.answers: dict[int, tuple] = {}  # answer d -> compressed elements at its head, codec
        self.wire = np.empty(0, dtype=np.float32)

    def piece(self, buf: np.ndarray, wire: str) -> np.ndarray:
        """buf's words in `wire` (valid until the next call; buf itself for
        none); buf becomes buf - decoded (keep_error). buf int16: a bfloat16
        or float16 tensor's own bits (ddp.py stages them so where its op's
        wire is that dtype), copied as they are (nothing to round or feed back)."""
        codec = self.codecs.of(wire)
        if buf.dtype == np.int16 and not isinstance(codec, Half):
            raise ValueError(f"a piece of 2-byte bits (int16) goes on a 2-byte wire, not {wire!r}")
        if codec is None:
            return buf
        words = codec.words(len(buf))
        if len(self.wire) < words:
            self.wire = np.empty(words, dtype=np.float32)
        out = self.wire[:words]
        if buf.dtype == np.int16:   # a tensor of the wire's dtype, staged as its bits: exact
            raw = out.view(np.int16)
            raw[:len(buf)] = buf
            raw[len(buf):] = 0
            return out
        codec.encode(buf, out, residual=buf if self.keep_error else None)
        return out

    def expect(self, d: int, n: int, wire: str) -> None:
        """Answer d starts with n elements in `wire` (a step's aggregate)."""
        codec = self.codecs.of(wire)
        if codec is None:
            self.answers.pop(d, None)
        else:
            self.answers[d] = (n, codec)

    def compressed(self, d: int) -> bool:
        return d in self.answers

    def wire_elems(self, d: int, nelems: int) -> int:
        got = self.answers.get(d)
        return nelems if got is None else got[1].words(got[0]) + nelems - got[0]

    def decode(self, d: int, wire: np.ndarray, out: np.ndarray) -> None:
        """The answer d's words into out (float32 [nelems])."""
        got = self.answers.pop(d, None)
        if got is None:
            np.copyto(out, wire)
            return
        n, codec = got
        words = codec.words(n)
        codec.decode(wire[None, :words], n, out[None, :n])
        out[n:] = wire[words:]


def check_peer(mine: str, chunk_bytes: int, server: dict, chunks: bool = False) -> None:
    """A worker's compress setting must be its server's (the server rounds an
    answer with error feedback only where the setting asked for rounding),
    and its chunk size too where it matters: always over LTP (`chunks`: each
    XDP program takes only DATA of its own chunk size), over TCP unless
    compress is none (an op's compressed words fill the LTP chunks)."""
    theirs = server.get("compress", "auto")
    if theirs != mine:
        raise UsageError(f"compress: this worker has {mine!r}, the server {theirs!r}; give every "
                         "rank the same (init(compress=...) or LTP_COMPRESS)")
    if (chunks or mine != "none") and server.get("chunk_bytes") != chunk_bytes:
        raise UsageError(f"this worker's chunks are {chunk_bytes} bytes, the server's "
                         f"{server.get('chunk_bytes')}: give every rank the same mtu "
                         "(init(mtu=...) or LTP_MTU)")


def piece_feedback(s) -> bool:
    """Whether a worker's link leaves a piece's rounding error in its buffer
    (for the optimizer's error feedback): not under compress auto, whose wire
    is the gradients' own dtype (nothing to feed back)."""
    return s.compress not in EXACT_COMPRESS


def answer_feedback(s) -> bool:
    """Whether a server carries an answer's rounding into the next: only where
    the compress setting asked for rounding (compress auto sends bf16 or fp16
    gradients as such, and the aggregate as their .grad would hold it, as
    gloo's all-reduce of that dtype does)."""
    return s.error_feedback and s.compress not in EXACT_COMPRESS
