#!/usr/bin/env bash
# Build a no-GPU stub libcuda.so.1 for a venv holding a CUDA build of vLLM, and make the
# venv preload it (only when no real libcuda.so.1 can be loaded) through a .pth file.
# usage: scripts/cuda_wheel/cuda_stub.sh VENV_DIR
set -euo pipefail; shopt -s globstar nullglob
V="$(cd "$1" && pwd)"
SP=$("$V/bin/python" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
OUT="$V/cuda-stub"; mkdir -p "$OUT"
# every cu* driver symbol that vLLM's extensions (and anything below them) import, plus the
# entry points cudart looks up itself
{ for f in "$SP"/vllm/*.so "$SP"/vllm/**/*.so; do [ -f "$f" ] && nm -D --undefined-only "$f" | awk '{print $2}'; done
  printf '%s\n' cuInit cuDeviceGetCount cuGetProcAddress cuGetProcAddress_v2 cuDriverGetVersion cuGetErrorString cuGetErrorName
} 2>/dev/null | sed 's/@.*//' | grep -E '^cu[A-Z]' | sort -u > "$OUT/symbols.txt"
{
  echo '/* generated: stub CUDA driver, every call fails with CUDA_ERROR_NO_DEVICE (100) */'
  echo 'static const char msg[] = "no CUDA driver (stub libcuda.so.1)";'
  echo 'int cuGetErrorString(int e, const char **s){ if(s) *s = msg; return 0; }'
  echo 'int cuGetErrorName(int e, const char **s){ if(s) *s = "CUDA_ERROR_NO_DEVICE"; return 0; }'
  echo 'int cuDriverGetVersion(int *v){ if(v) *v = 0; return 100; }'
  echo 'int cuDeviceGetCount(int *c){ if(c) *c = 0; return 100; }'
  grep -vxE 'cuGetErrorString|cuGetErrorName|cuDriverGetVersion|cuDeviceGetCount' "$OUT/symbols.txt" \
    | sed 's/.*/int &(void){ return 100; }/'
} > "$OUT/libcuda_stub.c"
cc -O1 -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$OUT/libcuda.so.1" "$OUT/libcuda_stub.c"
cat > "$SP/zz_cuda_stub.pth" <<PTH
import os, ctypes; exec("try:\n ctypes.CDLL('libcuda.so.1', mode=ctypes.RTLD_GLOBAL)\nexcept OSError:\n ctypes.CDLL('$OUT/libcuda.so.1', mode=ctypes.RTLD_GLOBAL)") if not os.environ.get('VLLM_NO_CUDA_STUB') else None
PTH
echo "stub: $OUT/libcuda.so.1 ($(wc -l < "$OUT/symbols.txt") symbols)"
