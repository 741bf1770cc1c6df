"""vllm-blackwell-ext: Triton attention backends, a DFlash speculator and a quantized-KV gather
op for stock vLLM, loaded through vLLM's `vllm.general_plugins` entry point.

Importing this package is cheap: no torch, Triton or vLLM import happens here.
"""

from vllm_blackwell_ext.registration import register, registered_components

__version__ = "0.1.0"
__all__ = ["register", "registered_components", "__version__"]
