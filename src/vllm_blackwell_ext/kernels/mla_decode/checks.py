"""Validation of MLA decode: the inputs of a launch and the requests of a plan.

Run where the plan is made (`mla_decode`, and an attention backend once per cache tensor), never
by `launch_mla_decode`. Checks read tensor metadata only (never device memory), and build
their messages only when they fail (`kernels.checks.fail`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from vllm_blackwell_ext.kernels.checks import check_index, fail
from vllm_blackwell_ext.kernels.mla_decode.configs import MlaDecodeConfig
from vllm_blackwell_ext.kernels.mla_decode.limits import MAX_QUERY_LEN, SUPPORTED_LATENT, VARIANTS

if TYPE_CHECKING:
    from vllm_blackwell_ext.kernels.mla_decode.layout import MlaCacheLayout
    from vllm_blackwell_ext.kernels.mla_decode.plan import MlaDecodePlan
    from vllm_blackwell_ext.kernels.mla_decode.workspace import MlaDecodeWorkspace

_FP8 = torch.float8_e4m3fn


def check_latent(kv_lora_rank: int) -> int:
    """A supported latent width; returns the row width (latent + rope)."""
    if kv_lora_rank not in SUPPORTED_LATENT:
        fail(ValueError, "kv_lora_rank", f"one of {sorted(SUPPORTED_LATENT)}", kv_lora_rank)
    return kv_lora_rank + SUPPORTED_LATENT[kv_lora_rank]


def check_query_len(query_len: int) -> None:
    if not 1 <= query_len <= MAX_QUERY_LEN:
        fail(ValueError, "query_len", f"a value in [1, {MAX_QUERY_LEN}]", query_len)


def check_query(q: torch.Tensor, width: int) -> None:
    if q.dim() != 3 or q.shape[-1] != width:
        fail(ValueError, "q", f"[num_tokens, num_heads, {width}]", f"shape {tuple(q.shape)}")
    if q.dtype not in (torch.bfloat16, torch.float16):
        fail(TypeError, "q", "dtype bfloat16 or float16", q.dtype)
    if q.stride(-1) != 1:
        fail(ValueError, "q", "a contiguous last dim", f"strides {q.stride()}")


def check_cache(kv_cache: torch.Tensor, q: torch.Tensor, width: int) -> None:
    """Shape, dtype (q's or e4m3), layout and device of the latent cache."""
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != width:
        shape = f"shape {tuple(kv_cache.shape)}"
        fail(ValueError, "kv_cache", f"[num_blocks, block_size, {width}]", shape)
    if kv_cache.dtype not in (q.dtype, _FP8):
        fail(TypeError, "kv_cache", f"dtype {q.dtype} (q's) or torch.float8_e4m3fn", kv_cache.dtype)
    if kv_cache.stride(-1) != 1:
        fail(ValueError, "kv_cache", "a contiguous last dim", f"strides {kv_cache.stride()}")
    if kv_cache.dtype == _FP8 and (
        kv_cache.stride(0) % 2 or kv_cache.stride(1) % 2 or kv_cache.data_ptr() % 2
    ):
        # The fp8 kernel reads the cache as 16-bit pairs of columns.
        fail(
            ValueError,
            "kv_cache",
            "a float8_e4m3fn cache with even page and token strides at an even address",
            f"strides {kv_cache.stride()}",
        )
    if kv_cache.device != q.device:
        fail(ValueError, "kv_cache", f"a tensor on {q.device} (q's device)", kv_cache.device)


def check_scale(k_scale: torch.Tensor | None, kv_cache: torch.Tensor, q: torch.Tensor) -> None:
    """The per-tensor scale: required for an fp8 cache, one float32 value on q's device."""
    if kv_cache.dtype == _FP8 and k_scale is None:
        fail(ValueError, "k_scale", "a 1-element float32 tensor for a float8_e4m3fn kv_cache", None)
    if k_scale is None:
        return
    if k_scale.numel() != 1 or k_scale.dtype != torch.float32:
        got = f"{k_scale.dtype} {tuple(k_scale.shape)}"
        fail(ValueError, "k_scale", "a 1-element float32 tensor", got)
    if k_scale.device != q.device:
        fail(ValueError, "k_scale", f"a tensor on {q.device} (q's device)", k_scale.device)


def check_batch(
    q: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, query_len: int
) -> None:
    """Index tensors, and q's tokens as batch x query_len."""
    check_index("block_table", block_table, 2, q.device, "q")
    check_index("seq_lens", seq_lens, 1, q.device, "q")
    check_query_len(query_len)
    batch = seq_lens.shape[0]
    if q.shape[0] != batch * query_len:
        expected = f"batch * query_len = {batch} * {query_len} tokens"
        fail(ValueError, "q", expected, f"{q.shape[0]} tokens")
    if block_table.shape[0] < batch:
        fail(ValueError, "block_table", f"at least batch = {batch} rows", block_table.shape[0])


def check_outputs(
    out: torch.Tensor, lse_out: torch.Tensor | None, q: torch.Tensor, kv_lora_rank: int
) -> None:
    tokens, heads = q.shape[0], q.shape[1]
    if out.shape != (tokens, heads, kv_lora_rank) or out.stride(-1) != 1:
        fail(
            ValueError,
            "out",
            f"[{tokens}, {heads}, {kv_lora_rank}] with a contiguous last dim",
            f"shape {tuple(out.shape)} strides {out.stride()}",
        )
    if out.device != q.device:
        fail(ValueError, "out", f"a tensor on {q.device} (q's device)", out.device)
    if lse_out is not None and (
        lse_out.shape != q.shape[:2]
        or lse_out.dtype != torch.float32
        or lse_out.stride(-1) != 1
        or lse_out.device != q.device
    ):
        fail(
            ValueError,
            "lse_out",
            f"float32 [{tokens}, {heads}] on {q.device} with a contiguous last dim",
            f"{lse_out.dtype} {tuple(lse_out.shape)} strides {lse_out.stride()} on "
            f"{lse_out.device}",
        )


def check_mla_decode_inputs(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    kv_lora_rank: int,
    query_len: int,
    k_scale: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
) -> None:
    """Every input of an MLA decode launch (`mla_decode`'s arguments of the same names)."""
    width = check_latent(kv_lora_rank)
    check_query(q, width)
    check_cache(kv_cache, q, width)
    check_scale(k_scale, kv_cache, q)
    check_batch(q, block_table, seq_lens, query_len)
    check_outputs(out, lse_out, q, kv_lora_rank)


def check_cache_layout(cache_layout: MlaCacheLayout, kv_cache: torch.Tensor) -> None:
    if cache_layout.kv_cache is not kv_cache:
        fail(
            ValueError,
            "cache_layout",
            "mla_cache_layout(kv_cache) of this very kv_cache",
            "the layout of another tensor",
        )


def check_layout_serves_plan(cache_layout: MlaCacheLayout, plan: MlaDecodePlan) -> None:
    """A cache the plan's maker described: TMA-readable with the page size the plan was made
    for (`plan.tma_page_size`), where it was made for one. A caller that makes plans for many
    batches over one cache (an attention backend) checks this once per cache."""
    if plan.tma_page_size is not None and cache_layout.tma_page_size != plan.tma_page_size:
        kv = cache_layout.kv_cache
        fail(
            ValueError,
            "kv_cache",
            f"a contiguous cache at a 16-byte address with {plan.tma_page_size}-token pages "
            f"(the decode plans read it through TMA)",
            f"{kv.dtype} shape {tuple(kv.shape)} strides {kv.stride()}",
        )


def check_plan_request(
    kv_lora_rank: int,
    query_len: int,
    num_splits: int | None,
    max_seq_len: int | None,
    variant: str | None,
) -> None:
    check_latent(kv_lora_rank)
    check_query_len(query_len)
    if num_splits is not None and num_splits < 1:
        fail(ValueError, "num_splits", ">= 1", num_splits)
    if num_splits is None and max_seq_len is None:
        fail(ValueError, "max_seq_len", "an int where num_splits is not given", None)
    if variant is not None and variant not in VARIANTS:
        fail(ValueError, "variant", f"one of {VARIANTS}", repr(variant))


def check_config_fits_cache(
    config: MlaDecodeConfig, tma_page_size: int | None, device_class: str
) -> None:
    """A TMA config needs a cache TMA can read, with pages a multiple of its key tile."""
    if config.tma and (tma_page_size is None or tma_page_size % config.block_n):
        fail(
            ValueError,
            "config",
            f"tma=False for this cache (TMA needs a contiguous cache at a 16-byte address "
            f"whose page size is a multiple of block_n = {config.block_n}, on sm90+)",
            f"tma=True with a TMA-readable page size of {tma_page_size} on {device_class}",
        )


def check_variant(
    variant: str, config: MlaDecodeConfig, kv_dtype: torch.dtype, gluon_ok: bool
) -> None:
    """A forced variant must be able to run `config` over a `kv_dtype` cache."""
    fp8 = kv_dtype == _FP8
    needs = {
        "triton": (not config.tma and not fp8, "a gathered config (tma=False), a 16-bit cache"),
        "triton_fp8": (not config.tma and fp8, "a gathered config (tma=False), an fp8 cache"),
        "triton_tma": (config.tma, "a TMA config (tma=True)"),
        "gluon": (config.tma and gluon_ok, "a TMA config where the Gluon kernel runs"),
    }
    ok, what = needs[variant]
    if not ok:
        fail(ValueError, "variant", f"{variant!r} with {what}", f"{config} over {kv_dtype}")


def check_workspace(workspace: MlaDecodeWorkspace, plan: MlaDecodePlan) -> None:
    """Scratch that holds the plan's partials (a one-split plan needs none)."""
    need = plan.workspace_rows
    if need and (workspace.capacity_rows < need or workspace.o_part.shape[1] != plan.kv_lora_rank):
        fail(
            ValueError,
            "workspace",
            f"at least {need} rows of {plan.kv_lora_rank} ({plan.num_tokens} tokens x "
            f"{plan.num_heads} heads x {plan.num_splits} splits)",
            f"{workspace.capacity_rows} rows of {workspace.o_part.shape[1]}",
        )
