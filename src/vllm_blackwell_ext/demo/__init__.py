"""`vllm-bwx demo` and the examples' CPU path: a tiny local checkpoint (`tiny_models`, nothing
downloaded) served by vLLM in a child process (`engine_job`), compared by `command`."""
