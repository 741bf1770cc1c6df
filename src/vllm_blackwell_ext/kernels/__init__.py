"""Pure Triton + torch kernels. Nothing here imports vLLM."""
