import math, torch
from triton import knobs
from vllm_blackwell_ext.kernels.paged_attention import paged_attention
events = []
def hook(*a, **kw):
    key = kw.get("key")
    events.append(key)
    print("COMPILE", str(kw.get("fn"))[:60], "key:", str(key)[:3000], flush=True)
    return False
knobs.runtime.jit_post_compile_hook = hook
dev = "cuda"
HQ, HKV, D, BS = 32, 8, 128, 128
def run(kv, q_len, seq_len, q):
    k, v = kv.transpose(1, 2).split([D, D], dim=-1)
    pages = -(-seq_len // BS)
    out = torch.empty(q.shape[0], HQ, D, dtype=torch.bfloat16, device=dev)
    i32 = dict(dtype=torch.int32, device=dev)
    paged_attention(q, k, v, out, torch.tensor([0, q_len], **i32), torch.tensor([seq_len], **i32),
                    torch.arange(1, pages + 1, **i32).view(1, pages), max_seqlen_q=q_len,
                    max_seqlen_k=seq_len, softmax_scale=1 / math.sqrt(D), causal=True)
    torch.cuda.synchronize()
print("== warmup-like")
kv = torch.zeros((3, HKV, BS, 2 * D), dtype=torch.bfloat16, device=dev)
run(kv, 17, 17 + BS, torch.zeros((17, HQ, D), dtype=torch.bfloat16, device=dev))
print("== engine-like")
kv2 = torch.zeros((2000, HKV, BS, 2 * D), dtype=torch.bfloat16, device=dev)
qkv = torch.zeros((512, HQ + 2 * HKV, D), dtype=torch.bfloat16, device=dev)
run(kv2, 500, 1500, qkv[:, :HQ])
print("== engine-like 2")
run(kv2, 300, 300, qkv[:300, :HQ])
