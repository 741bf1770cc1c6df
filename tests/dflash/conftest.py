"""dflash tests run tiny models: one intra-op thread is ~10x faster than two on the shared
2-core CI machines (thread contention dominates matmuls of this size)."""

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
