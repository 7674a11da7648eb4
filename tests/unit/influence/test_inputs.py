"""The layer-0 bound sup_j ‖v_a + p_j‖₂ for sinusoidal positions."""

from __future__ import annotations

import math

import pytest
import torch

from attnsens.influence.inputs import sinusoidal_position_bound
from attnsens.train.model import sinusoidal_position_embeddings


@pytest.mark.parametrize("d_model", [6, 7])
def test_sinusoidal_bound_covers_every_position_and_beats_the_triangle_inequality(d_model: int) -> None:
    torch.manual_seed(3)
    embedding = torch.randn(5, d_model, dtype=torch.float64)
    scale = 0.8
    bound = sinusoidal_position_bound(embedding, scale=scale).embedding_norm_upper_bound
    table = sinusoidal_position_embeddings(50_000, d_model, scale=scale).double()  # [query, d_model]
    observed = torch.linalg.vector_norm(embedding[:, None, :] + table[None], dim=-1).amax(dim=-1)
    triangle = torch.linalg.vector_norm(embedding, dim=-1) + scale * math.sqrt(math.ceil(d_model / 2))
    assert bool((observed <= bound).all())
    assert bool((bound <= triangle * (1 + 1e-6)).all())
    assert bool((observed >= 0.95 * bound).all())  # nearly attained over 50 000 positions
