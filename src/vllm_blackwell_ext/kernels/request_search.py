"""Which request a program's query block belongs to: a device-side search shared by the
attention kernels whose grids run over query blocks of variable-length requests."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def find_request(cu_q_ptr, q_block_idx, batch, BLOCK_Q: tl.constexpr):
    """Request owning global query block `q_block_idx` (binary search over cu_seqlens_q).

    Request b's blocks start at cu_q[b] // BLOCK_Q + b: an upper bound on the blocks of all
    earlier requests that needs no host knowledge of individual query lengths.
    """
    lo: tl.int32 = 0
    hi = batch
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = tl.load(cu_q_ptr + mid) // BLOCK_Q + mid
        if first_block <= q_block_idx:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1
