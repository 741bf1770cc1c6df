"""`benchmarks/vs_revision.py --check`: this checkout's ops against the same ops at 87dcf05 on
tiny cases, outputs bit-identical (the GPU timing run compares the same entry points).

Needs git and that revision in this checkout's history; skipped otherwise."""

from __future__ import annotations

import pytest

from benchmarks import vs_revision

pytestmark = pytest.mark.skipif(
    not vs_revision.revision_available(vs_revision.DEFAULT_REV),
    reason=f"needs git and revision {vs_revision.DEFAULT_REV} in this checkout's history",
)


@pytest.mark.parametrize("op", vs_revision.OPS)
def test_each_op_gives_the_revisions_outputs_bit_for_bit(op, device):
    assert vs_revision.run_check(vs_revision.DEFAULT_REV, [op], device=device) == []


def test_the_revision_loads_as_its_own_package_with_its_own_op_namespace():
    import torch

    old = vs_revision.load_revision(vs_revision.DEFAULT_REV)
    assert old.__name__ == "vllm_blackwell_ext_at_87dcf05"
    ops = vs_revision.module_of(old, "ops")
    assert ops.NAMESPACE == old.__name__
    assert hasattr(getattr(torch.ops, old.__name__), "gather_and_maybe_dequant_cache")
