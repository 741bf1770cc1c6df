"""DFlash in a real vLLM 0.32 CPU engine on our backends (BWX_ATTN, BWX_MLA; bf16 and fp8 KV):
the `bwx-*` variants of test_engine.py, whose docstring says what each checks. A file of their
own so that `--dist loadfile` runs them beside the fp32 variants."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="end-to-end tests need vLLM")

from .test_engine import BWX_VARIANTS, Variant, check_variant  # noqa: E402

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("variant", list(BWX_VARIANTS.values()), ids=list(BWX_VARIANTS))
def test_engine_proposals_equal_reference_and_output_is_lossless(
    tmp_path: Path, variant: Variant
) -> None:
    check_variant(tmp_path, variant)
