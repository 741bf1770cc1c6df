"""Side-by-side kernel benchmarks: `harness` (shared), one module per op with `main(argv)`,
run as `vllm-bwx bench <op>` or `python benchmarks/bench_<op>.py`."""
