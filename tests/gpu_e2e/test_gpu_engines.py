"""BWX_ATTN, BWX_MLA and the DFlash speculator inside real vLLM 0.32 engines on a GPU.

Same weights and prompts for every engine; decode batches replay in full CUDA graphs. Our runs
are held to vLLM's own backends within the noise measured, in the same session, between two of
vLLM's own backends on the same model (`conftest.assert_matches_within_noise`):
- BWX_ATTN (bf16) against FLASH_ATTN, noise FLASH_ATTN vs TRITON_ATTN; Qwen3-8B attention
  shapes, then a model with a sliding-window layer;
- BWX_ATTN with an fp8 cache: its error against vLLM's bf16 run at most 10% above that of
  vLLM's own fp8 run (TRITON_ATTN). Two fp8 runs cannot be held to bf16 noise: a value that
  upstream bf16 noise moves across an e4m3 rounding boundary changes by a whole fp8 step, so
  on the H200 two fp8 runs sat as far apart (mean 0.80 nats) as fp8 from bf16 (0.77-0.98);
- BWX_MLA against vLLM's default MLA backend on this GPU, noise default vs TRITON_MLA, with
  chunked prefill of long prompts, so the context gather runs through our op; fp8 against
  TRITON_MLA fp8; and with 128 heads (DeepSeek-V3 at TP1), bf16 and fp8, whose 64-row decode
  tiles Hopper reads through TMA;
- DFlash with our draft (target and draft on BWX_ATTN): the speculative engine's greedy output
  equals the target-only engine's (lossless), bf16 and fp8 KV, and with a z-lab draft mixing
  a sliding causal and a full non-causal layer; on vLLM 0.34+ also through our `bwx_dflash`
  speculative method.

vLLM starts its engine core by fork on CUDA (the CPU platform spawns), so registration is
inherited there; the spawn path is pinned by tests/e2e. Here the worker's report of which
backend serves each layer is the proof that ours ran.
"""

from __future__ import annotations

import re

import pytest

from vllm_blackwell_ext.vllm_compat import has_speculative_method_registry

from .conftest import (
    PROMPTS,
    assert_matches_within_noise,
    backend_noise,
    result_of,
    served_by,
    skip_without_cuda_vllm,
    teacher_forced_deltas,
)

skip_without_cuda_vllm()

pytestmark = pytest.mark.gpu


# Our fp8 error may exceed vLLM's own fp8 error by this factor at most.
FP8_MARGIN = 1.10


def _noise(engines, a: str, b: str) -> tuple[float, float]:
    return backend_noise(result_of(engines, a), result_of(engines, b))


@pytest.mark.parametrize(
    "job, backend",
    [
        ("qwen3-bwx_attn", "BWX_ATTN"),
        ("qwen3-bwx_attn-paged", "BWX_ATTN"),
        ("qwen3-bwx_attn-fp8", "BWX_ATTN"),
        ("sliding-bwx_attn", "BWX_ATTN"),
        ("mla-bwx_mla", "BWX_MLA"),
        ("mla-bwx_mla-fp8", "BWX_MLA"),
        ("mla128-bwx_mla", "BWX_MLA"),
        ("mla128-bwx_mla-fp8", "BWX_MLA"),
    ],
)
def test_our_backend_serves_every_layer_with_cuda_graphs(engines, job, backend):
    result = result_of(engines, job)
    assert served_by(result) == {backend}
    assert "Graph capturing finished" in result["log"], "no CUDA graphs were captured"


# vLLM's JIT monitor (on after its warm-up) logs each Triton kernel compiled while serving.
JIT_MONITOR_ON = "Kernel JIT monitor activated"
COMPILED_WHILE_SERVING = re.compile(r"Triton kernel JIT compilation during inference: (\w+)")


def _our_triton_kernels() -> set[str]:
    import triton

    from vllm_blackwell_ext.kernels import (
        fresh_prefill,
        kv_gather,
        paged_attention,
    )
    from vllm_blackwell_ext.kernels.mla_decode import (
        gluon_kernel,
        merge_kernel,
        split_fp8_kernel,
        split_kernel,
    )

    mla_decode = (split_kernel, split_fp8_kernel, merge_kernel, gluon_kernel)
    return {
        obj.fn.__name__
        for module in (fresh_prefill, kv_gather, *mla_decode, paged_attention)
        for obj in vars(module).values()
        if isinstance(obj, triton.runtime.JITFunction)
    }


@pytest.mark.parametrize(
    "job",
    [
        "qwen3-bwx_attn",
        "qwen3-bwx_attn-paged",
        "qwen3-bwx_attn-fp8",
        "sliding-bwx_attn",
        "mla-bwx_mla",
        "mla-bwx_mla-fp8",
        "mla128-bwx_mla",
        "mla128-bwx_mla-fp8",
        "dflash-bwx_attn",
    ],
)
def test_our_kernels_are_compiled_in_warmup_never_while_serving(engines, job):
    # Mixed prefill/decode batches, chunked context and verify blocks all ran in these jobs.
    log = result_of(engines, job)["log"]
    assert JIT_MONITOR_ON in log, "vLLM's JIT monitor was not on: nothing to check"
    compiled = set(COMPILED_WHILE_SERVING.findall(log))
    ours = _our_triton_kernels()
    assert {"_paged_attn_kernel", "_fresh_prefill_kernel", "_kv_gather_kernel"} <= ours
    assert "_mla_decode_gluon_kernel" in ours
    assert not compiled & ours, f"compiled while serving: {sorted(compiled & ours)}"


FRESH_PREFILL_LOG = "read their own K/V through TMA (fresh_prefill)"


def test_prompts_without_cached_context_take_the_tma_kernel_unless_switched_off(engines):
    # The first chunk of each long prompt has no cached context: on Hopper the bf16-cache layers
    # read its K/V through `fresh_prefill` by default; switched off, the paged kernel reads it.
    # Both are held to FLASH_ATTN (the default one by the test below).
    import torch

    from vllm_blackwell_ext.kernels.fresh_prefill import FRESH_PREFILL_CAPABILITIES

    if torch.cuda.get_device_capability() not in FRESH_PREFILL_CAPABILITIES:
        pytest.skip(f"fresh_prefill runs on capabilities {FRESH_PREFILL_CAPABILITIES} only")
    assert FRESH_PREFILL_LOG in result_of(engines, "qwen3-bwx_attn")["log"]
    paged = result_of(engines, "qwen3-bwx_attn-paged")
    assert FRESH_PREFILL_LOG not in paged["log"]
    noise = _noise(engines, "qwen3-flash_attn", "qwen3-triton_attn")
    assert_matches_within_noise(paged, result_of(engines, "qwen3-flash_attn"), noise)


def test_bwx_attn_matches_flash_attn_within_vllm_backend_noise(engines):
    noise = _noise(engines, "qwen3-flash_attn", "qwen3-triton_attn")
    assert_matches_within_noise(
        result_of(engines, "qwen3-bwx_attn"), result_of(engines, "qwen3-flash_attn"), noise
    )


PAGED_TMA_LOG = "BWX_ATTN: prefill reads the cache's 128-key tiles through TMA"


def test_chunks_after_cached_context_read_whole_page_tiles_through_tma_on_hopper(engines):
    # vLLM gives BWX_ATTN 128-token pages on Hopper (its preferred size) in whatever layout it
    # resolves; prompt chunks after the first read their cached context as whole TMA tiles
    # there, held to FLASH_ATTN by the tests above. fp8 caches gather.
    import torch

    from vllm_blackwell_ext.kernels.launch_cache import triton_version
    from vllm_blackwell_ext.kernels.paged_attention_configs import PREFILL_TMA_MIN_TRITON

    hopper = torch.cuda.get_device_capability() == (9, 0)
    takes = hopper and triton_version() >= PREFILL_TMA_MIN_TRITON
    for job in ("qwen3-bwx_attn", "qwen3-bwx_attn-paged", "sliding-bwx_attn"):
        log = result_of(engines, job)["log"]
        assert ("Setting kv cache block size to 128 for BWX_ATTN" in log) == hopper, job
        assert (PAGED_TMA_LOG in log) == takes, job
    assert PAGED_TMA_LOG not in result_of(engines, "qwen3-bwx_attn-fp8")["log"]


def _assert_fp8_error_no_worse(engines, reference: str, ours: str, theirs: str) -> None:
    """Our fp8 run's error against a bf16 run, against vLLM's own fp8 run's (max and mean)."""
    ref = result_of(engines, reference)
    ours_d = teacher_forced_deltas(ref, result_of(engines, ours))
    theirs_d = teacher_forced_deltas(ref, result_of(engines, theirs))
    assert max(ours_d) > 0, "fp8 run equals bf16: nothing quantised"
    assert max(ours_d) <= FP8_MARGIN * max(theirs_d), (max(ours_d), max(theirs_d))
    assert sum(ours_d) / len(ours_d) <= FP8_MARGIN * sum(theirs_d) / len(theirs_d)


def test_bwx_attn_fp8_cache_error_is_no_worse_than_vllm_own_fp8(engines):
    _assert_fp8_error_no_worse(
        engines, "qwen3-flash_attn", "qwen3-bwx_attn-fp8", "qwen3-triton_attn-fp8"
    )


def test_sliding_window_layer_matches_flash_attn(engines):
    assert max(len(p) for p in PROMPTS) > 4 * 256, "prompts must reach well past the window"
    noise = _noise(engines, "sliding-flash_attn", "sliding-triton_attn")
    assert_matches_within_noise(
        result_of(engines, "sliding-bwx_attn"), result_of(engines, "sliding-flash_attn"), noise
    )


def test_bwx_mla_matches_vllm_default_mla_with_chunked_context(engines):
    default = result_of(engines, "mla-default")
    assert served_by(default) - {"BWX_MLA"}, "the reference must be one of vLLM's backends"
    noise = _noise(engines, "mla-default", "mla-triton_mla")
    assert_matches_within_noise(result_of(engines, "mla-bwx_mla"), default, noise)


MLA128_TMA_LOG = "BWX_MLA: decode reads the cache's 64-key tiles through TMA (128 rows, %s kernel)"


def test_bwx_mla_with_128_heads_matches_vllm_default_and_takes_tma_on_hopper(engines):
    import torch

    default = result_of(engines, "mla128-default")
    assert served_by(default) - {"BWX_MLA"}, "the reference must be one of vLLM's backends"
    noise = _noise(engines, "mla128-default", "mla128-triton_mla")
    ours = result_of(engines, "mla128-bwx_mla")
    assert_matches_within_noise(ours, default, noise)
    # 64-token pages (BWX_MLA's preferred size), contiguous: Hopper's 64-row tiles use TMA,
    # through the Gluon kernel.
    hopper = torch.cuda.get_device_capability() == (9, 0)
    assert (MLA128_TMA_LOG % "Gluon" in ours["log"]) == hopper


def test_bwx_mla_fp8_cache_with_128_heads_is_no_worse_than_triton_mla_and_takes_tma(engines):
    import torch

    _assert_fp8_error_no_worse(
        engines, "mla128-default", "mla128-bwx_mla-fp8", "mla128-triton_mla-fp8"
    )
    ours = result_of(engines, "mla128-bwx_mla-fp8")
    # Hopper's fp8 64-row tiles read through TMA too, into the Gluon kernel (widened to bf16
    # in shared memory), on split plans the metadata builder made for that entry.
    hopper = torch.cuda.get_device_capability() == (9, 0)
    assert (MLA128_TMA_LOG % "Gluon" in ours["log"]) == hopper


def test_bwx_mla_fp8_cache_matches_triton_mla_fp8(engines):
    ours = result_of(engines, "mla-bwx_mla-fp8")
    assert max(teacher_forced_deltas(result_of(engines, "mla-bwx_mla"), ours)) > 0
    noise = _noise(engines, "mla-default", "mla-triton_mla")
    assert_matches_within_noise(ours, result_of(engines, "mla-triton_mla-fp8"), noise)


@pytest.mark.parametrize(
    "spec_job, target_job",
    [
        ("dflash-bwx_attn", "qwen3-bwx_attn"),
        ("dflash-bwx_attn-fp8", "qwen3-bwx_attn-fp8"),
        ("dflash_mixed-bwx_attn", "qwen3-bwx_attn"),
    ],
)
def test_dflash_on_bwx_attn_is_lossless(engines, spec_job, target_job):
    spec, target = result_of(engines, spec_job), result_of(engines, target_job)
    assert served_by(spec) == {"BWX_ATTN"}, "target and draft layers must run on BWX_ATTN"
    drafts = spec["spec_decode"].get("vllm:spec_decode_num_drafts", 0)
    assert drafts > 0, f"no speculative step ran: {spec['spec_decode']}"
    # Verify blocks (8 query tokens) and single-token decodes round differently: the same
    # noise bound as between two backends applies.
    noise = _noise(engines, "qwen3-flash_attn", "qwen3-triton_attn")
    assert_matches_within_noise(spec, target, noise)


def test_mixed_dflash_draft_layers_keep_their_own_attention_modes(engines):
    # vLLM's V1 runner refuses drafts mixing sliding and full layers; its V2 runner (the
    # default on CUDA) admits them. Ours keeps one KV group and gives each layer its own mode,
    # which BWX_ATTN applies over the batch's causal flag.
    modes = result_of(engines, "dflash_mixed-bwx_attn")["layer_modes"]
    assert modes and all("unavailable" not in worker for worker in modes), modes
    for worker in modes:
        index = {name: int(re.search(r"layers\.(\d+)\.", name).group(1)) for name in worker}
        in_layer_order = [worker[name] for name in sorted(worker, key=index.get)]
        assert in_layer_order == [[True, 256], [False, None]], worker


@pytest.mark.skipif(
    not has_speculative_method_registry(),
    reason="the bwx_dflash speculative method needs vLLM 0.34+ (register_speculative_method)",
)
def test_bwx_dflash_method_is_lossless(engines):
    test_dflash_on_bwx_attn_is_lossless(engines, "dflash_method-bwx_attn", "qwen3-bwx_attn")
