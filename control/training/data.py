# SPDX-License-Identifier: Apache-2.0
"""The built-in data set: scikit-learn's handwritten digits, split and sharded.

1797 8x8 images (64 features, 0..16, scaled to 0..1), 10 classes. The file
ships inside scikit-learn (sklearn/datasets/data/digits.csv.gz), so nothing is
downloaded; it is read with numpy directly because importing sklearn costs
about a second of CPU per rank, and a rig starts up to 65 ranks on 2 cores
(`load_digits` is the fallback and the test's reference).

Everything is a function of the seed: the held-out test split, the shard of
each worker (every W-th training example), and each worker's batch order
(a fresh permutation of its shard per pass, from (seed, worker, pass)).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import numpy as np

NCLASSES = 10
NFEATURES = 64
TEST_FRACTION = 0.2


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(X float32 [1797, 64] in 0..1, y int64 [1797])."""
    raw = None
    spec = importlib.util.find_spec("sklearn")
    if spec and spec.submodule_search_locations:
        path = os.path.join(next(iter(spec.submodule_search_locations)), "datasets", "data",
                            "digits.csv.gz")
        if os.path.exists(path):
            raw = np.loadtxt(path, delimiter=",")
    if raw is None:
        from sklearn.datasets import load_digits  # noqa: PLC0415 (1.2 s to import; only a run that loads the data)
        X, y = load_digits(return_X_y=True)
        raw = np.column_stack([X, y])
    X = (raw[:, :-1] / 16.0).astype(np.float32)
    y = raw[:, -1].astype(np.int64)
    return X, y


@dataclass
class Split:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def split(seed: int, test_fraction: float = TEST_FRACTION) -> Split:
    """A held-out test split fixed by the seed."""
    X, y = load_digits_arrays()
    perm = np.random.default_rng([seed, 0xD161]).permutation(len(X))
    nt = round(len(X) * test_fraction)
    te, tr = perm[:nt], perm[nt:]
    return Split(X[tr], y[tr], X[te], y[te])


class BatchStream:
    """A worker's endless stream of mini-batches over its shard.

    The shard is every `workers`-th training example starting at `worker`;
    each pass over it is a fresh permutation from (seed, worker, pass). WBSP's
    fast workers simply draw more batches from the same stream."""

    def __init__(self, data: Split, worker: int, workers: int, batch: int, seed: int):
        self.x, self.y = data.x_train, data.y_train
        self.shard = np.arange(worker, len(self.x), workers)
        if len(self.shard) == 0:
            raise ValueError(f"worker {worker} of {workers} has no training examples")
        self.batch = min(batch, len(self.shard))
        self.seed, self.worker = seed, worker
        self.npass = 0
        self.drawn = 0
        self._order = self._perm()
        self._pos = 0

    def _perm(self) -> np.ndarray:
        return self.shard[np.random.default_rng([self.seed, self.worker, self.npass])
                          .permutation(len(self.shard))]

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        if self._pos + self.batch > len(self._order):
            self.npass += 1
            self._order = self._perm()
            self._pos = 0
        idx = self._order[self._pos:self._pos + self.batch]
        self._pos += self.batch
        self.drawn += 1
        return self.x[idx], self.y[idx]
