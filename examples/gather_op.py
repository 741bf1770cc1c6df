"""The quantized-KV gather op from torch: read paged (fp8) cache rows back into a dense tensor.

GPU:  python examples/gather_op.py
CPU:  TRITON_INTERPRET=1 python examples/gather_op.py

`torch.ops.vllm_blackwell_ext.gather_and_maybe_dequant_cache` takes vLLM's arguments for its
CUDA op of the same name: here two sequences of 20 and 7 cached tokens in an fp8 cache of
16-token pages (MLA's 576-wide latent rows), dequantised with the per-tensor scale into bf16.
It is a torch custom op, so it also runs inside `torch.compile` (shown on the GPU).
"""

from __future__ import annotations

import torch

import vllm_blackwell_ext.ops  # noqa: F401  (registers torch.ops.vllm_blackwell_ext.*)


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    block_size, width, scale = 16, 576, torch.tensor([0.5], device=device)
    values = torch.randn(8, block_size, width, device=device)
    cache = (values / scale).to(torch.float8_e4m3fn).view(torch.uint8)  # vLLM stores uint8
    block_table = torch.tensor([[3, 5], [1, 0]], dtype=torch.int32, device=device)
    lens = [20, 7]
    cu_seq_lens = torch.tensor([0, 20, 27], dtype=torch.int32, device=device)
    token_to_seq = torch.tensor([0] * 20 + [1] * 7, dtype=torch.int32, device=device)
    dst = torch.empty(sum(lens), width, dtype=torch.bfloat16, device=device)

    def gather(out: torch.Tensor) -> torch.Tensor:
        torch.ops.vllm_blackwell_ext.gather_and_maybe_dequant_cache(
            cache, out, block_table, cu_seq_lens, token_to_seq, sum(lens), "fp8", scale
        )
        return out

    gather(dst)
    # What it read: the pages of each sequence in block-table order, times the scale.
    dequant = cache.view(torch.float8_e4m3fn).float() * scale
    expected = torch.cat([dequant[[3, 5]].reshape(-1, width)[:20], dequant[1][:7]])
    assert torch.equal(dst, expected.to(torch.bfloat16))
    print(f"gathered {dst.shape[0]} rows of {width} from an fp8 cache into {dst.dtype}: exact")
    if device == "cuda":
        compiled = torch.compile(gather, fullgraph=True)
        again = compiled(torch.empty_like(dst))
        assert torch.equal(again, dst)
        print("inside torch.compile(fullgraph=True): the same rows")


if __name__ == "__main__":
    main()
