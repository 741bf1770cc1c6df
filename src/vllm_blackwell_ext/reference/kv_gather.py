"""Pure-torch oracles of the paged-KV gather (vLLM's `gather_and_maybe_dequant_cache` and
`cp_gather_cache`). Nothing here imports `kernels/` or vLLM.

`*_ref` walk the tokens one by one in plain Python, straight from the CUDA kernel's loop, and
then move the rows they found with one indexed copy. `gather_vectorised` is the same rule
written with tensor indexing: it is what a user would write in torch (and what the benchmark
hands to `torch.compile` as the peer), and its tests pin it to the walk.
"""

from __future__ import annotations

import torch

_FP8 = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def _dequant(rows: torch.Tensor, kv_cache_dtype: str, scale, out_dtype: torch.dtype):
    """fp8 -> exact fp32, times the fp32 scale, one rounding (vLLM's `scaled_convert`)."""
    fp8 = _FP8.get(kv_cache_dtype)
    if fp8 is None:
        return rows.to(out_dtype)
    s = scale.to(torch.float32).reshape(())
    return (rows.view(fp8).to(torch.float32) * s).to(out_dtype)


def _walk(
    cu: list[int], seqs: list[int], tokens: list[int], bt: list[list[int]], starts, block_size
):
    """For each token: the (dst row, page, slot) the CUDA loop body computes, or None."""
    moves = []
    for t, b in zip(tokens, seqs, strict=False):
        if t >= cu[b + 1]:  # the CUDA kernel's `if (token_id >= batch_end) return;`
            continue
        offset = t - cu[b] + (starts[b] if starts is not None else 0)
        moves.append((t, bt[b][offset // block_size], offset % block_size))
    return moves


def _apply(src_cache, dst, moves, convert) -> None:
    if not moves:
        return
    t, page, slot = (
        torch.tensor(c, dtype=torch.long, device=dst.device) for c in zip(*moves, strict=False)
    )
    dst[t] = convert(src_cache[page.to(src_cache.device), slot.to(src_cache.device)])


def gather_and_maybe_dequant_cache_ref(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    token_to_seq: torch.Tensor,
    num_tokens: int,
    kv_cache_dtype: str,
    scale: torch.Tensor | None,
    seq_starts: torch.Tensor | None = None,
) -> None:
    cu = cu_seq_lens.tolist()
    seqs = token_to_seq[:num_tokens].tolist()
    starts = seq_starts.tolist() if seq_starts is not None else None
    moves = _walk(
        cu, seqs, list(range(num_tokens)), block_table.tolist(), starts, src_cache.shape[1]
    )
    _apply(src_cache, dst, moves, lambda r: _dequant(r, kv_cache_dtype, scale, dst.dtype))


def cp_gather_cache_ref(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None = None,
) -> None:
    cu = cu_seq_lens.tolist()
    seqs, tokens = [], []
    for b in range(batch_size):  # the CUDA grid's blockIdx.x walks sequences
        for t in range(cu[b], cu[b + 1]):
            seqs.append(b)
            tokens.append(t)
    starts = seq_starts.tolist() if seq_starts is not None else None
    moves = _walk(cu, seqs, tokens, block_table.tolist(), starts, src_cache.shape[1])
    # A raw copy: bytes in, bytes out (fp8 caches are often uint8 tensors).
    _apply(
        src_cache.view(torch.uint8) if src_cache.element_size() == 1 else src_cache,
        dst.view(torch.uint8) if dst.element_size() == 1 else dst,
        moves,
        lambda r: r,
    )


def gather_vectorised(
    src_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    token_to_seq: torch.Tensor,
    num_tokens: int,
    kv_cache_dtype: str,
    scale: torch.Tensor | None,
    seq_starts: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """The gather as tensor indexing; returns ``[num_tokens, *entry]``.

    Rows past their sequence's end (padding in `token_to_seq`) come back as zeros here; the op
    leaves them untouched. Callers compare only live rows, or use unpadded inputs.
    """
    t = torch.arange(num_tokens, device=block_table.device)
    b = token_to_seq[:num_tokens].long()
    begin, end = cu_seq_lens.long()[b], cu_seq_lens.long()[b + 1]
    pos = t - begin
    if seq_starts is not None:
        pos = pos + seq_starts.long()[b]
    live = t < end
    block_size = src_cache.shape[1]
    page = block_table.long()[b, torch.where(live, pos // block_size, 0)]
    rows = src_cache[torch.where(live, page, 0), torch.where(live, pos % block_size, 0)]
    out = _dequant(rows, kv_cache_dtype, scale, out_dtype)
    return torch.where(live.view(-1, *([1] * (out.dim() - 1))), out, 0)
