"""A micro GPT and its optimizer after two steps, for the checkpoint tests."""

from __future__ import annotations

import torch

from attnsens.train.model import GPT
from tests.unit.train.conftest import micro_model_config


def trained_pair() -> tuple[GPT, torch.optim.AdamW]:
    model = GPT(micro_model_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95))
    for _ in range(2):
        model.loss(torch.randint(0, 300, (3, 7)), torch.randint(0, 300, (3, 7))).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer
