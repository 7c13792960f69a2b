"""Blending several sources with weights (Megatron's BlendedDataset).

Blended sample i of an epoch is sample k of source d (`indexes.blend`: exact quotas, every prefix in
proportion). Each source is consumed as an endless stream of its own epochs: the k-th draw from source d
in blended epoch e is its draw number g = e * quota_d + k, i.e. its sample (g // len, g % len), so a small
source with a large weight is repeated in fresh shuffles and nothing is drawn twice before a source's
epoch is used up.
"""
from __future__ import annotations

from functools import cached_property

import numpy as np

from pretrain.data.indexes import blend, quotas
from pretrain.data.source import Lazy


class BlendedDataset(Lazy):
    """`size` samples per epoch (default: the sources' total) drawn from `sources` in proportion to
    `weights` (default: their sizes)."""

    def __init__(self, sources, weights=None, size: int | None = None):
        self.sources = list(sources)
        self.weights = [float(w) for w in (weights if weights is not None else map(len, self.sources))]
        if len(self.weights) != len(self.sources) or min(self.weights) < 0 or sum(self.weights) <= 0:
            raise ValueError(f"blend weights {self.weights}: need one non-negative weight per source, not all 0")
        self.size = size or sum(len(s) for s in self.sources)
        self.quota = quotas(self.weights, self.size)

    def __len__(self) -> int:
        return self.size

    @cached_property
    def index(self) -> np.ndarray:
        """(size, 2) [source, draw within the epoch], cached with the first source's index maps."""
        return self.sources[0].cache.get("blend", {"weights": self.weights, "size": self.size},
                                         lambda: blend(self.weights, self.size))

    def _draw(self, epoch: int, d: int, k: int) -> tuple[int, int]:
        return divmod(epoch * int(self.quota[d]) + k, len(self.sources[d]))

    def sample(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        d, k = (int(x) for x in self.index[index])
        return self.sources[d].sample(*self._draw(epoch, d, k))

    def prepare(self, epoch: int) -> None:
        for d, source in enumerate(self.sources):
            if self.quota[d]:
                first, last = self._draw(epoch, d, 0)[0], self._draw(epoch, d, int(self.quota[d]) - 1)[0]
                for e in range(first, last + 1):
                    source.prepare(e)
