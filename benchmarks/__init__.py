"""The lab: benchmarks and the tools behind them, run from a checkout (not installed).

`harness` (timing, tables, plots) and `vllm_peer` (vLLM's kernels as peers) are shared;
`dflash_pair` trains the tiny DFlash pair `bench_dflash` measures. Each `bench_<op>.py` is a
script with `main(argv)`: `python benchmarks/bench_<op>.py --help`.
"""
