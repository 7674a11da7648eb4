"""Shared test configuration: offline hub, fixed seeds, hypothesis profiles."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

# Without a GPU the Triton θ kernel runs under Triton's interpreter; this must be set before anything
# imports triton (torch itself may), so it lives here rather than in the kernel's test module.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from hypothesis import HealthCheck, settings

# The shared helpers assert as the test modules do: with pytest's detailed messages.
pytest.register_assert_rewrite("tests.helpers")

settings.register_profile(
    "ci", derandomize=True, max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile("thorough", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture
def one_torch_thread():
    """torch on one intra-op thread for the test (restored after): tiny tensors gain nothing from threads, and on a
    busy 2-core machine spinning threads cost up to 10×."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _fixed_seed() -> None:
    torch.manual_seed(0)
