"""vLLM attention adapters (BWX_ATTN, BWX_MLA).

Kept import-light on purpose: vLLM loads the adapter modules by qualified name
(`vllm_blackwell_ext.attention.bwx_attn.BwxAttentionBackend`), and only those modules may
import vLLM. Importing this package imports neither vLLM nor the kernels.
"""
