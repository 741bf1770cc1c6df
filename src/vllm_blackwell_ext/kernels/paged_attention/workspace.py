"""Caller-owned scratch of split-KV launches, allocated once (CUDA-graph safe)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_blackwell_ext.kernels.device import DeviceInfo, device_info
from vllm_blackwell_ext.kernels.paged_attention.plan import (
    MAX_SPLITS,
    split_kv_max_rows,
    split_kv_max_tokens,
)


@dataclass
class SplitKVWorkspace:
    """Caller-owned scratch of the split-KV path, allocated once (CUDA-graph safe).

    `partial_out` holds rows of (query token x split) partial outputs, [max_rows, H, Dv];
    `partial_lse` their log2-sum-exps, [max_rows, H]. A launch with T tokens and S splits uses
    the first T * S rows, addressed as contiguous [T, H, S, ...]; `paged_attention` lowers S
    to what fits. `split_counts` (int32, zero between launches) counts the finished splits of
    each (query block, KV head) of a launch that merges in the kernel.
    """

    partial_out: torch.Tensor
    partial_lse: torch.Tensor
    split_counts: torch.Tensor
    max_num_tokens: int
    max_splits: int

    @property
    def max_rows(self) -> int:
        return self.partial_out.shape[0]

    @property
    def num_q_heads(self) -> int:
        return self.partial_out.shape[1]

    @property
    def head_size_v(self) -> int:
        return self.partial_out.shape[2]

    @classmethod
    def allocate(
        cls,
        max_num_tokens: int,
        num_q_heads: int,
        head_size_v: int,
        max_splits: int = MAX_SPLITS,
        device: torch.device | str | None = None,
        *,
        max_rows: int | None = None,
    ) -> SplitKVWorkspace:
        """Allocate scratch for up to `max_num_tokens` tokens x `max_splits` splits.

        `max_rows` caps tokens x splits (many splits only ever come with few tokens);
        default `max_num_tokens * max_splits`.
        """
        for name, val in (
            ("max_num_tokens", max_num_tokens),
            ("num_q_heads", num_q_heads),
            ("head_size_v", head_size_v),
            ("max_splits", max_splits),
        ):
            if not isinstance(val, int) or val < 1:
                raise ValueError(f"{name}: expected a positive int, got {val!r}")
        rows = max_num_tokens * max_splits if max_rows is None else int(max_rows)
        if rows < 1:
            raise ValueError(f"max_rows: expected a positive int, got {max_rows!r}")
        return cls(
            partial_out=torch.empty(
                (rows, num_q_heads, head_size_v), dtype=torch.float32, device=device
            ),
            partial_lse=torch.empty((rows, num_q_heads), dtype=torch.float32, device=device),
            # One count per (query block, KV head): a launch of T tokens has at most 2T query
            # blocks (T // BLOCK_Q + requests), and at most as many KV heads as query heads.
            split_counts=torch.zeros(
                2 * max_num_tokens * num_q_heads, dtype=torch.int32, device=device
            ),
            max_num_tokens=max_num_tokens,
            max_splits=max_splits,
        )

    @classmethod
    def for_device(
        cls,
        num_q_heads: int,
        num_kv_heads: int,
        head_size_v: int,
        device: torch.device | str | None = None,
        info: DeviceInfo | None = None,
    ) -> SplitKVWorkspace:
        """Scratch for every launch `plan_split_kv` may split on this device (a few MiB)."""
        info = info if info is not None else device_info(device)
        return cls.allocate(
            split_kv_max_tokens(num_kv_heads, info),
            num_q_heads,
            head_size_v,
            MAX_SPLITS,
            device,
            max_rows=max(1, split_kv_max_rows(num_kv_heads, info)),
        )
