"""Test set-up: Triton's interpreter on CPU-only machines, GPU tests skipped there, a clean coverage record.

Without a GPU the Triton kernels run on CPU tensors through Triton's interpreter; it must be switched on
before Triton (and so `sk`) is imported, hence here, first.
"""
import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import contextlib  # noqa: E402

import pytest  # noqa: E402

import sk  # noqa: E402


@pytest.fixture
def settings_override():
    """`settings_override(name=value, ...)`: `sk.settings.override` for the rest of the test."""
    with contextlib.ExitStack() as stack:
        yield lambda **values: stack.enter_context(sk.settings.override(**values))


@pytest.fixture(autouse=True)
def _fresh_coverage_record():
    sk.coverage.reset()
    yield
    sk.coverage.reset()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
