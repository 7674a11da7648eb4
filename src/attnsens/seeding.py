"""Random generators derived from what a result is about, so that a result never depends on what ran before it.

``derived_generator("run-a", 0, 100, 3)`` is the same stream in every process, on every rerun and after any
interruption: its seed is the first 63 bits of the sha256 of the key's JSON text. The estimators of a study
draw from such a generator keyed by (run, seed, step, layer, estimator), never from torch's global generator.
"""

from __future__ import annotations

import hashlib
import json

import torch


def derived_seed(*key: object) -> int:
    """A 63-bit seed determined by ``key`` (plain values: strings, numbers, None)."""
    text = json.dumps(list(key), default=str, separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def derived_generator(*key: object, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch.Generator on ``device`` seeded with :func:`derived_seed` of ``key``.

    >>> a, b = derived_generator("run-a", 0, 100, 3), derived_generator("run-a", 0, 100, 3)
    >>> torch.equal(torch.rand(3, generator=a), torch.rand(3, generator=b))
    True
    """
    return torch.Generator(device=device).manual_seed(derived_seed(*key))
