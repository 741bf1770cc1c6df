"""What the MLA decode kernels are built for: latent widths, query rows, splits."""

# (kv_lora_rank, rope_dim) pairs the kernels are built for: DeepSeek/Kimi (512 + 64) and the
# half-width variant (256 + 32).
SUPPORTED_LATENT: dict[int, int] = {512: 64, 256: 32}
# Query tokens per request (MTP / speculative verification blocks), causal within them.
MAX_QUERY_LEN = 8
# Upper bound of the split planner; a workspace sized with it fits every plan.
MAX_SPLITS = 256
# From this many splits on, the merge takes its wide-split launch config (`plan.merge_config`).
WIDE_MERGE_SPLITS = 64
# The kernel variants a plan names (`plan.choose_variant` says which runs what).
VARIANTS: tuple[str, ...] = ("triton", "triton_fp8", "triton_tma", "gluon")
