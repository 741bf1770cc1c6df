"""BWX_ATTN inside a real vLLM engine on a model with a sliding-window layer, against vLLM's own
CPU backend (and its fp32 run for the bf16 noise). Same setup and tolerances as
test_bwx_attn_engine.py, whose docstring gives them; a file of its own so that `--dist loadfile`
runs these engines beside that module's."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import assert_same_generation, run_engine_job
from tests.e2e.test_bwx_attn_engine import (
    BF16_MAX_TOL,
    BF16_MEAN_TOL,
    OURS_ENV,
    _served_by,
    _spec,
)


@pytest.fixture(scope="module")
def sliding_runs(tiny_models, tmp_path_factory):
    model = tiny_models["sliding-window"]
    base = tmp_path_factory.mktemp("bwx-attn-sliding")
    return {
        "reference": run_engine_job(_spec(model, ours=False), base / "reference"),
        "reference_fp32": run_engine_job(
            _spec(model, ours=False, dtype="float32"), base / "reference-fp32"
        ),
        "ours": run_engine_job(_spec(model, ours=True), base / "ours", OURS_ENV),
    }


def test_sliding_window_layers_match_vllm_cpu_backend(sliding_runs):
    assert _served_by(sliding_runs["ours"]) == {"BWX_ATTN"}
    runs = sliding_runs
    assert_same_generation(
        runs["reference"], runs["ours"], BF16_MAX_TOL, BF16_MEAN_TOL, fp32=runs["reference_fp32"]
    )
