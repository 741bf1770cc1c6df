"""Split-KV scratch of MLA decode, sized once and reused by every launch."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_blackwell_ext.kernels.device import DeviceInfo, device_info
from vllm_blackwell_ext.kernels.mla_decode.plan import plan_mla_decode


@dataclass
class MlaDecodeWorkspace:
    """Split-KV scratch, allocated once (outside CUDA-graph capture) and reused by every call.

    `capacity_rows` is the largest `num_tokens * num_heads * num_splits` it holds; a plan that
    needs more is refused (`checks.check_workspace`) rather than allocating.
    """

    o_part: torch.Tensor  # fp32 [capacity_rows, kv_lora_rank]
    l_part: torch.Tensor  # fp32 [capacity_rows]

    @classmethod
    def allocate(
        cls,
        max_num_tokens: int,
        num_heads: int,
        max_splits: int,
        kv_lora_rank: int = 512,
        device: torch.device | str = "cuda",
    ) -> MlaDecodeWorkspace:
        """Scratch for `max_num_tokens` tokens x `num_heads` heads x `max_splits` splits."""
        rows = max(1, max_num_tokens * num_heads * max_splits)
        return cls(
            o_part=torch.empty(rows, kv_lora_rank, dtype=torch.float32, device=device),
            l_part=torch.empty(rows, dtype=torch.float32, device=device),
        )

    @classmethod
    def for_plans(
        cls,
        max_tokens: int,
        num_heads: int,
        max_seq_len: int,
        max_query_len: int = 1,
        kv_lora_rank: int = 512,
        device: torch.device | str = "cuda",
        *,
        kv_dtype: torch.dtype = torch.bfloat16,
        info: DeviceInfo | None = None,
        tma_page_size: int | None = None,
    ) -> MlaDecodeWorkspace:
        """The smallest scratch that fits every `plan_mla_decode` plan of up to `max_tokens`
        query tokens, for query lengths 1..`max_query_len`, contexts up to `max_seq_len` and
        the same `tma_page_size`.

        The planner splits small batches more, and plans for the longest context dominate the
        shorter ones (splits grow with the context), so every batch size and query length is
        walked at the longest context: host arithmetic only, and far smaller than
        `max_tokens * heads * MAX_SPLITS`.
        """
        info = info or device_info(device)
        need = 1
        for query_len in range(1, max_query_len + 1):
            for batch in range(1, max_tokens // query_len + 1):
                # The latent width changes no plan's split count (and is checked where the
                # launch's plan is made).
                plan = plan_mla_decode(
                    batch, num_heads, max_seq_len, query_len, info, kv_dtype=kv_dtype,
                    tma_page_size=tma_page_size,
                )  # fmt: skip
                need = max(need, plan.workspace_rows)
        return cls(
            o_part=torch.empty(need, kv_lora_rank, dtype=torch.float32, device=device),
            l_part=torch.empty(need, dtype=torch.float32, device=device),
        )

    @property
    def capacity_rows(self) -> int:
        return self.l_part.shape[0]
