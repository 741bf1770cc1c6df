"""Paged-attention benchmark (BWX_ATTN kernel vs vLLM 0.32's Triton unified attention).

Thin script: the logic lives in `vllm_blackwell_ext.bench.paged_attention` so that
`vllm-bwx bench paged_attention` runs the same code.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from vllm_blackwell_ext.bench.paged_attention import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
