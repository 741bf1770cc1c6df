#!/usr/bin/env bash
# What a GPU machine verifies, as one job: run it through `scripts/gpu_kit.sh bg NAME` (or
# `run`) so the kit's torch and vLLM are used. Steps, in the order given:
#
#   tests       kernel and op tests at real sizes, beside the GPU engine tests (tests/gpu_e2e)
#   kernels     the kernel and op tests alone
#   attention   benchmarks/bench_engine.py: BWX_ATTN against vLLM's attention backends
#   mla         benchmarks/bench_engine.py --family mla: BWX_MLA against vLLM's MLA backends
#   gather      benchmarks/bench_kv_gather.py: the paged-KV gather against vLLM's CUDA gather
#   paged       benchmarks/bench_paged_attention.py: the kernel against vLLM's Triton kernel,
#               SDPA and FlashInfer (.peer_flashinfer from scripts/fetch_flashinfer_peer.sh, carried)
#   mla-decode  benchmarks/bench_mla_decode.py: the MLA decode kernel against vLLM's Triton MLA,
#               FlashInfer's MLA and FlashMLA (sources from scripts/fetch_flashmla_peer.sh, carried)
#   mla-rows    the MLA kernel tests of the TMA path (mla-tma-row-tiles.txt)
#   mla-fp8     the fp8 widening tests (mla-fp8.txt)
#   ncu         benchmarks/profile_ncu.py under Nsight Compute: speed of light, occupancy, pipe
#               use and stall reasons of each row short of its goal (ncu-missed-goals.txt);
#               BWX_NCU_ARGS passes it arguments (say --family mla)
#
#   scripts/gpu_verify.sh OUT_DIR tests attention mla gather paged mla-decode
#
# The experiments that used to run here left the tree (benchmarks/README.md, "Routes tried":
# their code is at 87dcf05). The steps that need no vLLM (kernels, mla-rows, mla-fp8, ncu)
# also run on the device image's own torch and Triton, without the kit (a short lease: no pieces to carry):
#
#   PYTHONPATH=src:. scripts/gpu_verify.sh OUT_DIR mla-fp8 kernels
#
# OUT_DIR gets the pytest logs, the engine tests' summary.md and the benchmark results; each
# engine's figures are written as soon as it finishes, so a run cut short keeps those.
set -uo pipefail
[[ $# -ge 2 ]] || { sed -n '2,28p' "$0"; exit 2; }
out=$1
shift
mkdir -p "$out"
status=0
# One pytest per kernel and op test file, three at a time: most of their time is Triton
# compiling (CPU-bound), which the GPU machine's cores share out; three keep the GPU memory of
# their largest cases well apart from the engines' that may run beside them.
kernel_tests() {
  ls tests/kernels/test_*.py tests/ops/test_*.py | OUT="$out" xargs -P 3 -I {} \
    sh -c 'python -m pytest -q "$1" > "$OUT/kernel-tests-$(basename "$1" .py).log" 2>&1' _ {}
}
# The host's CPU (model, AMX / AVX-512 flags): GPU machines are the one place an Intel AMX host
# may come, which the CPU test path has to meet too.
python -c 'from vllm_blackwell_ext.host_cpu import cpu_summary_line as h; print("[gpu_verify] host CPU:", h())' ||
  grep -m1 "model name" /proc/cpuinfo
for step in "$@"; do
  echo "[gpu_verify] $step starts at $(date +%T)"
  case $step in
    tests)
      kernel_tests &
      kernels=$!
      BWX_GPU_E2E_DIR=${BWX_GPU_E2E_DIR:-/tmp/bwx-gpu-e2e} BWX_GPU_E2E_JOBS=${BWX_GPU_E2E_JOBS:-6} \
        python -m pytest -q tests/gpu_e2e > "$out/gpu-e2e.log" 2>&1 || status=1
      wait "$kernels" || status=1
      cp "${BWX_GPU_E2E_DIR:-/tmp/bwx-gpu-e2e}/summary.md" "$out/gpu-e2e-summary.md" 2>/dev/null
      tail -n 1 "$out"/kernel-tests-*.log "$out/gpu-e2e.log"
      ;;
    kernels)
      kernel_tests || status=1
      tail -n 1 "$out"/kernel-tests-*.log
      ;;
    attention | mla)
      python benchmarks/bench_engine.py --family "$step" --out-dir "$out/bench" \
        --profile-batch 64 || status=1
      ;;
    gather)
      python benchmarks/bench_kv_gather.py --out-dir "$out/bench" || status=1
      ;;
    paged)
      python benchmarks/bench_paged_attention.py --out-dir "$out/bench" || status=1
      ;;
    mla-decode)
      python benchmarks/bench_mla_decode.py --out-dir "$out/bench" || status=1
      ;;
    mla-rows)
      python -m pytest -q tests/kernels/test_mla_decode.py -k "tma" > "$out/mla-tma-row-tiles.txt" 2>&1 ||
        status=1
      tail -n 5 "$out/mla-tma-row-tiles.txt"
      ;;
    mla-fp8)
      { python -m pytest -q tests/kernels/test_fp8_pairs.py &&
        python -m pytest -q tests/kernels/test_mla_decode.py -k "integer_ops or e4m3"; } \
        > "$out/mla-fp8.txt" 2>&1 || status=1
      tail -n 40 "$out/mla-fp8.txt"
      ;;
    ncu)
      metrics=dram__throughput.avg.pct_of_peak_sustained_elapsed
      for pipe in alu fma lsu tensor_op_hmma xu; do
        metrics+=,sm__inst_executed_pipe_$pipe.avg.pct_of_peak_sustained_active
      done
      metrics+=,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
      metrics+=,smsp__issue_active.avg.pct_of_peak_sustained_active
      for stall in barrier long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle \
        not_selected; do
        metrics+=,smsp__average_warps_issue_stalled_${stall}_per_issue_active.ratio
      done
      ncu --profile-from-start off --clock-control none --section SpeedOfLight \
        --section Occupancy --section LaunchStats --metrics "$metrics" \
        python benchmarks/profile_ncu.py ${BWX_NCU_ARGS:-} > "$out/ncu-missed-goals.txt" 2>&1 ||
        status=1
      grep -E "^== |Duration|Registers Per|DRAM Throughput  " "$out/ncu-missed-goals.txt" | head -60
      ;;
    *)
      echo "[gpu_verify] unknown step: $step" >&2
      status=2
      ;;
  esac
done
echo "[gpu_verify] done at $(date +%T), exit status $status"
exit $status
