"""Test-wide setup. Imports nothing from vLLM: kernel and op tests run on the GPU machine as-is.

Triton kernels run on the CPU through the interpreter when no GPU is present; the variable must
be set before `triton` is first imported, which is why it is set here, at collection start.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


@pytest.fixture(scope="session")
def device() -> str:
    """Where kernel tests run: 'cuda' on a GPU machine, 'cpu' under TRITON_INTERPRET=1."""
    return "cuda" if ON_GPU else "cpu"
