"""What an engine job reports from its workers (`demo.engine_job`), on stand-in workers: the
backend serving each attention layer, and the attention mode a layer carries of its own."""

from __future__ import annotations

from types import SimpleNamespace

from vllm_blackwell_ext.attention.layer_overrides import LAYER_CAUSAL_ATTR, LAYER_WINDOW_ATTR
from vllm_blackwell_ext.demo import engine_job


def _worker(layers: dict[str, object]) -> SimpleNamespace:
    compilation = SimpleNamespace(static_forward_context=layers)
    return SimpleNamespace(
        model_runner=SimpleNamespace(vllm_config=SimpleNamespace(compilation_config=compilation))
    )


def test_layers_with_their_own_mode_are_reported_with_it_and_others_are_not():
    sliding = SimpleNamespace(**{LAYER_CAUSAL_ATTR: True, LAYER_WINDOW_ATTR: 256})
    full = SimpleNamespace(**{LAYER_CAUSAL_ATTR: False, LAYER_WINDOW_ATTR: None})
    target = SimpleNamespace(attn_backend=None)
    worker = _worker({"draft.0": sliding, "draft.1": full, "target.0": target})
    assert engine_job.layer_modes_of_worker(worker) == {
        "draft.0": [True, 256],
        "draft.1": [False, None],
    }


def test_a_failing_report_is_kept_as_its_error_not_raised():
    class Engine:
        def collective_rpc(self, fn):
            raise RuntimeError("worker gone")

    (report,) = engine_job.worker_report(Engine(), engine_job.layer_modes_of_worker)
    assert "worker gone" in report["unavailable"][0]
