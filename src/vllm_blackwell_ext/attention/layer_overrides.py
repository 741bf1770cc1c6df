"""Per-layer attention modes a DFlash draft sets on vLLM's `Attention` layers.

vLLM 0.32 runs a draft's layers under one batch-wide causal flag; a draft mixing causal sliding
and non-causal full layers sets these attributes on each layer, and a backend whose impl class
declares `IMPL_CAPABILITY_ATTR` (BWX_ATTN) honours them.
"""

LAYER_CAUSAL_ATTR = "bwx_causal"
LAYER_WINDOW_ATTR = "bwx_sliding_window"
IMPL_CAPABILITY_ATTR = "supports_layer_attention_overrides"
