"""Input validation of paged attention: shapes, dtypes, devices and strides, read from tensor
metadata only (never device memory). Run where a plan is made: per call by the standalone
`paged_attention`, once per cache tensor by an attention backend; `launch` checks nothing."""

from __future__ import annotations

import torch

from vllm_blackwell_ext.kernels.checks import check_index, fail

SUPPORTED_HEAD_SIZES: tuple[int, ...] = (64, 80, 96, 128, 192, 256)
SUPPORTED_Q_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
SUPPORTED_KV_DTYPES: tuple[torch.dtype, ...] = (
    torch.bfloat16,
    torch.float16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
)


def check_paged_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    max_seqlen_q: int,
    max_seqlen_k: int,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float = 0.0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
) -> None:
    """Every check of one paged-attention call (the arguments of `paged_attention`)."""
    check_query(q)
    check_caches(q, key_cache, value_cache)
    check_output(q, value_cache, out)
    check_batch(q, cu_seqlens_q, seq_lens, block_table, max_seqlen_q, max_seqlen_k)
    check_options(q, sliding_window, sinks, softcap, k_scale, v_scale, lse_out)


def check_query(q: torch.Tensor) -> None:
    if q.dim() != 3:
        fail(ValueError, "q", "[num_tokens, num_q_heads, head_size]", f"shape {tuple(q.shape)}")
    if q.dtype not in SUPPORTED_Q_DTYPES:
        fail(TypeError, "q", "dtype bf16 or fp16", q.dtype)
    if q.stride(2) != 1:
        fail(ValueError, "q", "a contiguous last dim", f"strides {q.stride()}")
    _check_head_size("q", q.shape[2])


def check_caches(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    """Both cache views, against each other and against `q` (already checked)."""
    for name, c in (("key_cache", key_cache), ("value_cache", value_cache)):
        _check_cache(name, c, q)
    if value_cache.dtype != key_cache.dtype:
        fail(TypeError, "value_cache", f"the key_cache dtype {key_cache.dtype}", value_cache.dtype)
    if value_cache.element_size() == 1 and (
        value_cache.stride(0) % 2 or value_cache.stride(1) % 2 or value_cache.data_ptr() % 2
    ):
        # fp8 value tiles are read as 16-bit pairs of columns (`fp8_pairs`).
        fail(
            ValueError,
            "value_cache",
            "an fp8 cache with even block and slot strides at an even address",
            f"strides {value_cache.stride()}",
        )
    if tuple(value_cache.shape[:3]) != tuple(key_cache.shape[:3]):
        fail(
            ValueError,
            "value_cache",
            f"leading dims {tuple(key_cache.shape[:3])} like key_cache",
            tuple(value_cache.shape[:3]),
        )
    num_q_heads, head_size = q.shape[1], q.shape[2]
    _, block_size, num_kv_heads, head_size_k = key_cache.shape
    if head_size_k != head_size:
        fail(ValueError, "key_cache", f"head_size {head_size} (from q)", head_size_k)
    _check_head_size("value_cache", value_cache.shape[3])
    if block_size % 16 != 0 or block_size <= 0:
        fail(ValueError, "key_cache", "a block_size multiple of 16", block_size)
    if num_kv_heads <= 0 or num_q_heads % num_kv_heads != 0:
        fail(ValueError, "q", f"num_q_heads a multiple of num_kv_heads={num_kv_heads}", num_q_heads)


def check_output(q: torch.Tensor, value_cache: torch.Tensor, out: torch.Tensor) -> None:
    expected = (q.shape[0], q.shape[1], value_cache.shape[3])
    if tuple(out.shape) != expected:
        fail(ValueError, "out", f"shape {expected}", tuple(out.shape))
    if out.dtype != q.dtype:
        fail(TypeError, "out", f"dtype {q.dtype} like q", out.dtype)
    if out.stride(2) != 1:
        fail(ValueError, "out", "a contiguous last dim", f"strides {out.stride()}")
    if out.device != q.device:
        fail(ValueError, "out", f"device {q.device}", out.device)


def check_batch(
    q: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
) -> None:
    """The batch's index tensors and its host-side length bounds."""
    for name, t, nd in (
        ("cu_seqlens_q", cu_seqlens_q, 1),
        ("seq_lens", seq_lens, 1),
        ("block_table", block_table, 2),
    ):
        check_index(name, t, nd, q.device, "q")
    batch = seq_lens.shape[0]
    if cu_seqlens_q.shape[0] != batch + 1:
        fail(
            ValueError,
            "cu_seqlens_q",
            f"batch + 1 = {batch + 1} entries (seq_lens has {batch})",
            cu_seqlens_q.shape[0],
        )
    if block_table.shape[0] < batch:  # its rows' unit stride: check_index above
        fail(
            ValueError,
            "block_table",
            f"[batch >= {batch}, max_blocks]",
            f"shape {tuple(block_table.shape)}",
        )
    if not isinstance(max_seqlen_q, int) or max_seqlen_q < 0:
        fail(ValueError, "max_seqlen_q", "a non-negative int", repr(max_seqlen_q))
    if not isinstance(max_seqlen_k, int) or max_seqlen_k < 0:
        fail(ValueError, "max_seqlen_k", "a non-negative int", repr(max_seqlen_k))


def check_options(
    q: torch.Tensor,
    sliding_window: int | None,
    sinks: torch.Tensor | None,
    softcap: float,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    lse_out: torch.Tensor | None,
) -> None:
    """Window, sinks, soft cap, fp8 scales and the optional LSE output."""
    num_tokens, num_q_heads = q.shape[0], q.shape[1]
    if sliding_window is not None and not (isinstance(sliding_window, int) and sliding_window > 0):
        fail(ValueError, "sliding_window", "None or a positive int", repr(sliding_window))
    if not softcap >= 0.0:
        fail(ValueError, "softcap", ">= 0 (0 = off)", softcap)
    if sinks is not None:
        if sinks.dtype != torch.float32 or tuple(sinks.shape) != (num_q_heads,):
            fail(
                ValueError, "sinks", f"fp32 [{num_q_heads}]", f"{sinks.dtype} {tuple(sinks.shape)}"
            )
        _check_device("sinks", sinks, q)
    for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
        _check_scale(name, sc, q)
    if (k_scale is None) != (v_scale is None):
        fail(
            ValueError,
            "k_scale/v_scale",
            "both or neither",
            f"k_scale={'set' if k_scale is not None else None}, "
            f"v_scale={'set' if v_scale is not None else None}",
        )
    if lse_out is not None:
        if lse_out.dtype != torch.float32 or tuple(lse_out.shape) != (num_tokens, num_q_heads):
            fail(
                ValueError,
                "lse_out",
                f"fp32 [{num_tokens}, {num_q_heads}]",
                f"{lse_out.dtype} {tuple(lse_out.shape)}",
            )
        _check_device("lse_out", lse_out, q)


def check_workspace(workspace, q: torch.Tensor, head_size_v: int) -> None:
    """A `SplitKVWorkspace` that fits the launch of `q` (heads, value width, device)."""
    num_q_heads = q.shape[1]
    if workspace.num_q_heads != num_q_heads or workspace.head_size_v != head_size_v:
        fail(
            ValueError,
            "workspace",
            f"[*, {num_q_heads}, {head_size_v}] scratch",
            f"[*, {workspace.num_q_heads}, {workspace.head_size_v}]",
        )
    if workspace.partial_out.device != q.device:
        fail(ValueError, "workspace", f"device {q.device}", workspace.partial_out.device)


def check_cache_layout(layout, key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    """A `PagedCacheLayout` made of these very cache views."""
    if layout.key_cache is not key_cache or layout.value_cache is not value_cache:
        fail(
            ValueError,
            "cache_layout",
            "paged_cache_layout(key_cache, value_cache) of these very key_cache/value_cache",
            "the layout of other tensors",
        )


def _check_cache(name: str, c: torch.Tensor, q: torch.Tensor) -> None:
    if c.dim() != 4:
        fail(
            ValueError,
            name,
            "[num_blocks, block_size, num_kv_heads, head_size]",
            f"shape {tuple(c.shape)}",
        )
    if c.dtype == torch.uint8:
        fail(
            TypeError,
            name,
            f"the fp8 dtype a uint8 cache holds (view it first, e.g. "
            f"{name}.view(torch.float8_e4m3fn))",
            "a uint8 cache",
        )
    if c.dtype not in SUPPORTED_KV_DTYPES:
        fail(TypeError, name, f"dtype in {SUPPORTED_KV_DTYPES}", c.dtype)
    if c.stride(3) != 1:
        fail(ValueError, name, "a contiguous head dim", f"strides {c.stride()}")
    _check_device(name, c, q)


def _check_head_size(name: str, hs: int) -> None:
    if hs not in SUPPORTED_HEAD_SIZES:
        fail(ValueError, name, f"head size in {SUPPORTED_HEAD_SIZES}", f"head size {hs}")


def _check_scale(name: str, sc: torch.Tensor | None, q: torch.Tensor) -> None:
    if sc is None:
        return
    if sc.dtype != torch.float32 or sc.numel() < 1:
        fail(ValueError, name, "a 1-element fp32 tensor", f"{sc.dtype} {tuple(sc.shape)}")
    _check_device(name, sc, q)


def _check_device(name: str, t: torch.Tensor, q: torch.Tensor) -> None:
    if t.device != q.device:
        fail(ValueError, name, f"device {q.device}", t.device)


def check_plan_fits(shape, q: torch.Tensor, layout) -> None:
    """The `AttnShape` a plan was made for describes the launch of `q` over `layout`'s caches
    (an attention backend plans from vLLM's cache spec; each layer checks it once)."""
    key_cache, value_cache = layout.key_cache, layout.value_cache
    _, block_size, num_kv_heads, head_size = key_cache.shape
    facts = {
        "q_dtype": (shape.q_dtype, q.dtype),
        "kv_dtype": (shape.kv_dtype, key_cache.dtype),
        "num_q_heads": (shape.num_q_heads, q.shape[1]),
        "num_kv_heads": (shape.num_kv_heads, num_kv_heads),
        "head_size": (shape.head_size, head_size),
        "head_size_v": (shape.head_size_v, value_cache.shape[3]),
        "block_size": (shape.block_size, block_size),
        "tma_page_size": (shape.tma_page_size, layout.tma_page_size),
    }
    wrong = {name: pair for name, pair in facts.items() if pair[0] != pair[1]}
    if wrong:
        fail(
            ValueError,
            "plan",
            "a plan made for this layer's query and cache",
            "; ".join(f"{n}: planned {p}, tensors {t}" for n, (p, t) in wrong.items()),
        )
