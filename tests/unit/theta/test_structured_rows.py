"""Soundness on rows of 2–34 keys whose logits have structure that Gaussian scores lack: integer multiples of
log 2 (every probability a power of two when their sum is one, rounded otherwise), exact duplicates, two blocks
of keys, a few large keys over many small ones, heavy tails. Each certificate is checked exactly against the
integer meet-in-the-middle oracle, by default and with every row enumerated (``exact_support=34``), on both CPU
backends.

Rows of 24–27 powers of two crashed the four-list search (a modulus larger than its pair sums) until a randomised
comparison of this kind found them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnsens.theta import certify
from tests.reference.theta_oracles import theta_dyadic_meet_in_the_middle
from tests.unit.theta.test_real_rows import dyadic
from tests.unit.theta.test_soundness import BACKENDS, assert_certificate_sound

FAMILIES = ("powers_of_two", "log2_integers", "duplicates", "two_blocks", "few_large", "heavy_tail", "near_uniform")
LENGTHS = (2, 7, 16, 24, 25, 26, 27, 31, 34)
MAX_LOGIT_SPREAD = 10.0
"""Logits are clipped to this far below the largest: probabilities within a factor e^10 < 2^15, so the oracle's
integers (multiples of the smallest value's ulp) stay below 2^46/n."""


def structured_row(family: str, n_keys: int, rng: np.random.Generator) -> torch.Tensor:
    """A float32 softmax row of ``n_keys`` keys with the family's logits."""
    if family == "powers_of_two":
        return powers_of_two_summing_to_one(n_keys, rng)
    if family == "log2_integers":
        z = rng.integers(-4, 4, n_keys) * math.log(2)
    elif family == "duplicates":
        z = rng.choice(rng.standard_normal(3), n_keys)
    elif family == "two_blocks":
        z = np.where(np.arange(n_keys) < rng.integers(1, n_keys + 1), 0.0, rng.uniform(-3, 0))
        z = z + 0.01 * rng.standard_normal(n_keys)
    elif family == "few_large":
        z = 0.1 * rng.standard_normal(n_keys)
        z[: rng.integers(1, 5)] += rng.uniform(2, 12)
    elif family == "heavy_tail":
        z = 0.5 * rng.standard_cauchy(n_keys)
    else:
        z = 10.0 ** rng.uniform(-4, -1) * rng.standard_normal(n_keys)
    p = np.exp(np.maximum(z - z.max(), -MAX_LOGIT_SPREAD))
    return torch.from_numpy((p / p.sum()).astype(np.float32))


def powers_of_two_summing_to_one(n_keys: int, rng: np.random.Generator) -> torch.Tensor:
    """1 halved n_keys − 1 times, each time a random value of at least 2^-8 split into two halves: a softmax of
    integer multiples of log 2 whose probabilities are exact (a sum that is a power of two)."""
    exponents = [0]
    for _ in range(n_keys - 1):
        splittable = [i for i, k in enumerate(exponents) if k < 8]
        k = exponents.pop(splittable[rng.integers(len(splittable))])
        exponents += [k + 1, k + 1]
    return torch.tensor([2.0**-k for k in rng.permutation(exponents)], dtype=torch.float32)


def structured_rows(seed: int) -> tuple[torch.Tensor, list[str]]:
    rng = np.random.default_rng(seed)
    rows, labels = [], []
    for family in FAMILIES:
        for n_keys in LENGTHS:
            for k in range(2):
                rows.append(torch.nn.functional.pad(structured_row(family, n_keys, rng), (0, max(LENGTHS) - n_keys)))
                labels.append(f"{family}, {n_keys} keys, #{k}")
    return torch.stack(rows), labels


@pytest.mark.parametrize("backend", BACKENDS)
def test_structured_logit_rows_contain_theta(backend: str) -> None:
    rows, labels = structured_rows(seed=3)
    default = certify(rows, backend=backend)
    enumerated = certify(rows, backend=backend, exact_support=34)
    exact_by_default = 0
    for i, row in enumerate(rows):
        theta = theta_dyadic_meet_in_the_middle(*dyadic(row))
        for name, cert in (("default", default), ("exact_support=34", enumerated)):
            lower, upper = float(cert.lower[i]), float(cert.upper[i])
            assert_certificate_sound(lower, upper, theta, f"{labels[i]} [{backend}, {name}]")
        assert bool(enumerated.exact[i]), labels[i]
        if int((row != 0).sum()) <= 24:
            assert bool(default.exact[i]), labels[i]
        exact_by_default += bool(default.exact[i])
    assert exact_by_default > len(rows) // 2  # not vacuous: most of these rows are proved by default
