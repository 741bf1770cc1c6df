"""Per-layer attention modes a DFlash draft sets on vLLM's `Attention` layers.

vLLM 0.32's default model runner runs a draft's layers under one batch-wide causal flag (its
v2 runner can pass one per KV-cache group); a draft mixing causal sliding and non-causal full
layers sets these attributes on each layer, and a backend whose impl class declares
`IMPL_CAPABILITY_ATTR` (BWX_ATTN) honours them over the batch's flag.
"""

LAYER_CAUSAL_ATTR = "bwx_causal"
LAYER_WINDOW_ATTR = "bwx_sliding_window"
IMPL_CAPABILITY_ATTR = "supports_layer_attention_overrides"
