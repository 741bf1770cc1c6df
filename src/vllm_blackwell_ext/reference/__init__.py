"""Pure-torch oracles of every kernel. Nothing here imports `kernels/` or vLLM."""
