"""Causal prefill of requests without cached context, from the chunk's own K/V through TMA.

A request whose keys all arrive in this step (a new prompt with no prefix-cache hit) has them
contiguous in the forward's `key` / `value` ([tokens, num_kv_heads, head]) as well as paged in
the cache. This kernel reads them from there: each 128-key tile is one tensor-memory-access
copy (TMA) into shared memory, three tiles in flight, instead of a gather page by page through
the block table. Same values as the cache holds when the cache has the query's dtype, so the
same attention (up to the order of fp32 sums). The experiment this kernel comes from, with
these tiles (H200, Qwen3-8B shapes, native image: torch 2.11, Triton 3.6;
`benchmarks/experiments/attn_prefill_tma.py`, `h200-attn-prefill-tma.txt`): causal 8k 585
TFLOP/s, 4 x 4k 534, against 369 / 339 for the paged kernel and 610 / 595 for torch SDPA
(cuDNN) in the same run. This kernel, on an H100 in vLLM 0.32's environment (torch 2.13, Triton
3.7.1; `bench_paged_attention.py`, `h100-paged-attention.md`): causal 8k 521.0 TFLOP/s, 4 x 4k
473.9, 0.924x / 0.888x cuDNN SDPA in the same run.

Which requests it takes is decided on the device, by one rule both kernels apply to the same
`cu_seqlens_q` and `seq_lens`: no cached context and at least FRESH_PREFILL_MIN_QUERY_LEN query
tokens. This kernel computes those and the paged kernel, launched with
`skip_fresh_from=FRESH_PREFILL_MIN_QUERY_LEN`, skips them, so together they cover every request
whatever the host believed; the host's view (`has_fresh_prefill`) only decides whether to
launch this kernel at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from vllm_blackwell_ext.kernels.checks import check_index, fail
from vllm_blackwell_ext.kernels.device import DeviceInfo, device_info
from vllm_blackwell_ext.kernels.launch_cache import DEFAULT_NUM_STAGES, CachedLauncher
from vllm_blackwell_ext.kernels.paged_attention import _find_request

__all__ = [
    "FRESH_PREFILL_MIN_QUERY_LEN",
    "FreshPrefillConfig",
    "fresh_prefill",
    "fresh_prefill_config",
    "fresh_prefill_requests",
    "fresh_prefill_supported",
    "has_fresh_prefill",
]

# Requests this long or longer, without cached context, take this kernel: one key tile. Shorter
# ones are a few microseconds in the paged kernel, where this launch's host cost would dominate.
FRESH_PREFILL_MIN_QUERY_LEN = 128
# Where it runs: Hopper (measured there). TMA exists on sm100/sm120 too, but this kernel is
# neither measured nor sized for them (sm120's 101 KB would not hold three 128 x 128 stages).
FRESH_PREFILL_CAPABILITIES: tuple[tuple[int, int], ...] = ((9, 0),)
FRESH_PREFILL_HEAD_SIZES: tuple[int, ...] = (64, 128)
FRESH_PREFILL_MAX_GQA = 16
_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class FreshPrefillConfig:
    block_m: int  # query rows per program: block_q tokens x GQA heads of one KV head
    tile_n: int  # keys per TMA tile
    num_warps: int
    num_stages: int
    # Ask for the scores of the next key tile before this tile's softmax, so the softmax's
    # exponentials overlap the previous tile's P @ V on the tensor cores (FlashAttention 3's
    # intra-warpgroup overlap; the sm90 SASS then waits for the scores after the softmax).
    skew_scores: bool = False

    def block_q(self, gqa: int) -> int:
        return self.block_m // gqa


# H200 (experiment above): 128 x 128 tiles, 8 warps, 3 stages were the fastest of the tiles,
# stage counts and warp-specialised variants tried (2 stages: 442 TFLOP/s at causal 8k).
_GPU_CONFIG = FreshPrefillConfig(block_m=128, tile_n=128, num_warps=8, num_stages=3)
# The CPU interpreter: small tiles keep the tests quick.
_INTERPRETER_CONFIG = FreshPrefillConfig(block_m=32, tile_n=32, num_warps=4, num_stages=2)


def fresh_prefill_config(info: DeviceInfo) -> FreshPrefillConfig:
    return _INTERPRETER_CONFIG if info.device_class == "cpu" else _GPU_CONFIG


def fresh_prefill_supported(
    info: DeviceInfo,
    *,
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    num_q_heads: int,
    num_kv_heads: int,
    head_size: int,
    head_size_v: int,
    causal: bool,
    sliding_window: int | None,
    has_sinks: bool,
    softcap: float,
) -> bool:
    """Whether a layer's fresh prefills can take this kernel with the paged kernel's result."""
    gqa, rem = divmod(num_q_heads, num_kv_heads)
    return (
        (info.device_class == "cpu" or info.capability in FRESH_PREFILL_CAPABILITIES)
        # the cache holds the very values of key/value only in their own dtype
        and kv_dtype == q_dtype
        and q_dtype in (torch.bfloat16, torch.float16)
        and head_size == head_size_v
        and head_size in FRESH_PREFILL_HEAD_SIZES
        and rem == 0
        and gqa <= FRESH_PREFILL_MAX_GQA
        and gqa & (gqa - 1) == 0
        and causal
        and sliding_window is None
        and not has_sinks
        and not softcap
    )


def fresh_prefill_requests(query_start_loc: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """Which requests of a batch this kernel takes (bool per request), from host copies of its
    `cu_seqlens_q` ([requests + 1]) and `seq_lens` (at least [requests]; an upper bound is
    enough: a request it calls fresh has seq_len == query_len, the least it can have)."""
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    return (q_lens >= FRESH_PREFILL_MIN_QUERY_LEN) & (seq_lens[: q_lens.shape[0]] == q_lens)


def has_fresh_prefill(query_start_loc: torch.Tensor, seq_lens: torch.Tensor) -> bool:
    """Whether a batch holds a request this kernel takes (`fresh_prefill_requests`)."""
    return bool(fresh_prefill_requests(query_start_loc, seq_lens).any())


@triton.jit
def _scores(q, k, visible, MASKED: tl.constexpr, qk_scale, DOT_FP32: tl.constexpr):
    if DOT_FP32:  # the CPU interpreter: its bf16 dots multiply raw bits
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if MASKED:
        s = tl.where(visible, s, float("-inf"))
    return s


@triton.jit
def _softmax_pv(acc, l_i, m_i, s, v, DOT_FP32: tl.constexpr):
    if DOT_FP32:
        v = v.to(tl.float32)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def _attend_tile(
    acc, l_i, m_i, q, k, v, visible, MASKED: tl.constexpr, qk_scale, DOT_FP32: tl.constexpr
):
    s = _scores(q, k, visible, MASKED, qk_scale, DOT_FP32)
    return _softmax_pv(acc, l_i, m_i, s, v, DOT_FP32)


# The batch size changes from batch to batch: a runtime value, so the JIT warm-up's scratch
# compiles the variant the engine launches. The output strides stay specialised (multiples of 16
# for every head size taken here): offline sm90 compiles (Triton 3.6) of the 128 x 128 x 3-stage
# tiles spill registers with them as runtime values and do not without.
@triton.jit(do_not_specialize=["batch", "min_query_len"])
def _fresh_prefill_kernel(
    q_desc,  # query [T, H, HEAD], block [BLOCK_Q, GQA, HEAD]
    k_desc,  # key as [T, HKV * HEAD], block [TILE_N, HEAD]
    v_desc,  # value likewise
    out_ptr,
    cu_q_ptr,
    seq_lens_ptr,
    batch,
    qk_scale,  # softmax scale x log2(e)
    stride_ot,
    stride_oh,
    min_query_len,
    GQA: tl.constexpr,
    HEAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    STAGES: tl.constexpr,
    DOT_FP32: tl.constexpr,
    SKEW: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_Q * GQA
    # Programs in reverse: a request's later blocks see more keys, so they start first.
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    req = _find_request(cu_q_ptr, pid, batch, BLOCK_Q)
    q_start = tl.load(cu_q_ptr + req)
    q_len = tl.load(cu_q_ptr + req + 1) - q_start
    q_block = pid - (q_start // BLOCK_Q + req)
    if q_block * BLOCK_Q >= q_len:
        return  # the grid is an upper bound: this block lies past the request's queries
    if (tl.load(seq_lens_ptr + req) != q_len) | (q_len < min_query_len):
        return  # cached context, or short: the paged kernel's (the same rule there)

    offs_m = tl.arange(0, BLOCK_M)
    q_local = q_block * BLOCK_Q + offs_m // GQA  # = the row's position: no cached context
    head = kv_head * GQA + offs_m % GQA
    row_ok = q_local < q_len
    tok = (q_start + q_local).to(tl.int64)
    # Rows past the request (the next request's tokens, or TMA's zeros past the tensor) are
    # computed and never stored; keys past the request lie beyond every stored row's position.
    q = q_desc.load([q_start + q_block * BLOCK_Q, kv_head * GQA, 0]).reshape(BLOCK_M, HEAD)
    if DOT_FP32:
        q = q.to(tl.float32)
    first = q_block * BLOCK_Q
    last = tl.minimum(first + BLOCK_Q, q_len) - 1
    whole_hi = (first + 1) // TILE_N  # tiles every row of the block sees whole
    tile_hi = (last + TILE_N) // TILE_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD], tl.float32)
    col = kv_head * HEAD
    offs_n = tl.arange(0, TILE_N)
    if SKEW:
        # Tile j + 1's scores are asked for ahead of tile j's softmax (FreshPrefillConfig);
        # the last ones (tile whole_hi's, zeros past the tensor) go unused.
        s = _scores(q, k_desc.load([q_start, col]), None, False, qk_scale, DOT_FP32)
        for j in tl.range(0, whole_hi, num_stages=STAGES):
            k = k_desc.load([q_start + (j + 1) * TILE_N, col])
            v = v_desc.load([q_start + j * TILE_N, col])
            s_next = _scores(q, k, None, False, qk_scale, DOT_FP32)
            acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, s, v, DOT_FP32)
            s = s_next
    else:
        for j in tl.range(0, whole_hi, num_stages=STAGES):
            k = k_desc.load([q_start + j * TILE_N, col])
            v = v_desc.load([q_start + j * TILE_N, col])
            acc, l_i, m_i = _attend_tile(acc, l_i, m_i, q, k, v, None, False, qk_scale, DOT_FP32)
    for j in tl.range(whole_hi, tile_hi):
        k = k_desc.load([q_start + j * TILE_N, col])
        v = v_desc.load([q_start + j * TILE_N, col])
        visible = (j * TILE_N + offs_n)[None, :] <= q_local[:, None]
        acc, l_i, m_i = _attend_tile(acc, l_i, m_i, q, k, v, visible, True, qk_scale, DOT_FP32)
    out = acc / l_i[:, None]
    offs_d = tl.arange(0, HEAD)
    tl.store(
        out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )


# Through compiled handles (`launch_cache`): prefill layers launch it eagerly on every step.
_FRESH_PREFILL_LAUNCHER = CachedLauncher(_fresh_prefill_kernel)


def _check_activation(name: str, t: object, q: torch.Tensor, shape: tuple[int, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        fail(TypeError, name, "a torch.Tensor", type(t).__name__)
    if t.dtype != q.dtype:
        fail(TypeError, name, f"dtype {q.dtype} (the query's)", t.dtype)
    if t.device != q.device:
        fail(ValueError, name, f"a tensor on {q.device} (the query's device)", t.device)
    if tuple(t.shape) != shape:
        fail(ValueError, name, f"shape {shape}", f"shape {tuple(t.shape)}")
    # TMA reads rows through their stride: the head dim packed, heads adjacent, 16-byte rows.
    elem = t.element_size()
    if t.stride(-1) != 1 or t.stride(-2) != t.shape[-1]:
        fail(ValueError, name, "packed heads (strides (row, head_size, 1))", f"{t.stride()}")
    if t.data_ptr() % 16 or (t.stride(0) * elem) % 16:
        fail(ValueError, name, "a 16-byte aligned start and row stride", f"{t.stride()}")


def _validate(q, key, value, out, cu_seqlens_q, seq_lens) -> None:
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        fail(ValueError, "q", "a [num_tokens, num_heads, head_size] tensor", getattr(q, "shape", q))
    if q.dtype not in (torch.bfloat16, torch.float16):
        fail(TypeError, "q", "dtype torch.bfloat16 or torch.float16", q.dtype)
    tokens, num_heads, head = q.shape
    if head not in FRESH_PREFILL_HEAD_SIZES:
        fail(ValueError, "q", f"head size in {FRESH_PREFILL_HEAD_SIZES}", head)
    _check_activation("q", q, q, tuple(q.shape))
    if not isinstance(key, torch.Tensor) or key.dim() != 3:
        fail(ValueError, "key", "a [num_tokens, num_kv_heads, head_size] tensor", key)
    num_kv_heads = key.shape[1]
    gqa, rem = divmod(num_heads, num_kv_heads)
    if rem or gqa > FRESH_PREFILL_MAX_GQA or gqa & (gqa - 1):
        fail(
            ValueError,
            "key",
            f"num_kv_heads dividing q's {num_heads} heads by a power of 2 up to "
            f"{FRESH_PREFILL_MAX_GQA}",
            num_kv_heads,
        )
    for name, t in (("key", key), ("value", value)):
        _check_activation(name, t, q, (tokens, num_kv_heads, head))
    _check_activation("out", out, q, tuple(q.shape))
    check_index("cu_seqlens_q", cu_seqlens_q, 1, q.device, "q")
    check_index("seq_lens", seq_lens, 1, q.device, "q")
    if cu_seqlens_q.shape[0] != seq_lens.shape[0] + 1:
        fail(
            ValueError,
            "cu_seqlens_q",
            f"{seq_lens.shape[0] + 1} entries (one more than seq_lens)",
            cu_seqlens_q.shape[0],
        )


def fresh_prefill(
    q: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    softmax_scale: float,
    info: DeviceInfo | None = None,
    check_inputs: bool = True,
    config: FreshPrefillConfig | None = None,
) -> torch.Tensor:
    """Causal attention of each request without cached context and with at least
    FRESH_PREFILL_MIN_QUERY_LEN queries, over its own keys; returns `out`.

    Request b's queries are q[cu_seqlens_q[b] : cu_seqlens_q[b + 1]] (length L_b); it is this
    kernel's when seq_lens[b] == L_b, and then its keys and values are the same rows of `key`
    and `value` (query i sits at position i). Only those requests' rows of `out` are written.
    `check_inputs=False` skips the checks for callers that validated the same layout once;
    `config` overrides the device's launch config (experiments, tests).
    """
    if check_inputs:
        _validate(q, key, value, out, cu_seqlens_q, seq_lens)
    tokens, num_heads, head = q.shape
    batch = seq_lens.shape[0]
    if tokens == 0 or batch == 0:
        return out
    info = info if info is not None else device_info(q.device)
    cfg = config or fresh_prefill_config(info)
    num_kv_heads = key.shape[1]
    gqa = num_heads // num_kv_heads
    block_q = cfg.block_q(gqa)
    num_q_blocks = tokens // block_q + batch  # upper bound; surplus blocks exit at once
    q_desc = TensorDescriptor(q, [tokens, num_heads, head], list(q.stride()), [block_q, gqa, head])
    k_desc, v_desc = (
        TensorDescriptor(t, [tokens, num_kv_heads * head], [t.stride(0), 1], [cfg.tile_n, head])
        for t in (key, value)
    )
    os_ = out.stride()
    _FRESH_PREFILL_LAUNCHER.launch(
        (num_q_blocks, num_kv_heads, 1),
        (
            q_desc, k_desc, v_desc, out, cu_seqlens_q, seq_lens, batch,
            float(softmax_scale) * _LOG2E, os_[0], os_[1], FRESH_PREFILL_MIN_QUERY_LEN,
            # constexprs, in signature order: GQA .. SKEW
            gqa, head, block_q, cfg.tile_n, cfg.num_stages, info.device_class == "cpu",
            cfg.skew_scores,
        ),
        num_warps=cfg.num_warps,
        num_stages=DEFAULT_NUM_STAGES,
    )  # fmt: skip
    return out
