"""Our ops and DCP helper against vLLM 0.32's own definitions (here, not under tests/kernels or
tests/ops, because those must import nothing from vLLM: they run on the GPU machine as-is)."""

from __future__ import annotations

import inspect

import pytest
import torch

from tests.distributed.dcp_layout import dcp_local_seq_lens
from vllm_blackwell_ext import ops

vllm_ops = pytest.importorskip("vllm._custom_ops", reason="needs vLLM")
vllm_attn_utils = pytest.importorskip("vllm.v1.attention.backends.utils", reason="needs vLLM")


@pytest.mark.parametrize("name", ["gather_and_maybe_dequant_cache", "cp_gather_cache"])
def test_argument_names_and_order_match_vllm(name):
    theirs = inspect.signature(getattr(vllm_ops, name)).parameters
    ours = inspect.signature(getattr(ops, name)).parameters
    assert list(ours) == list(theirs)
    assert [p.default for p in ours.values()] == [p.default for p in theirs.values()]
    schema = getattr(torch.ops.vllm_blackwell_ext, name).default._schema
    assert [a.name for a in schema.arguments] == list(theirs)


def test_local_seq_lens_match_vllm():
    lens = torch.tensor([0, 1, 5, 17, 64, 100, 257], dtype=torch.int32)
    for n in (1, 2, 3, 4, 8):
        for i in (1, 2, 16, 64):
            want = vllm_attn_utils.get_dcp_local_seq_lens(lens, n, None, i)
            assert torch.equal(dcp_local_seq_lens(lens, n, None, i), want)
            for r in range(n):
                assert torch.equal(
                    dcp_local_seq_lens(lens, n, r, i),
                    vllm_attn_utils.get_dcp_local_seq_lens(lens, n, r, i),
                )
