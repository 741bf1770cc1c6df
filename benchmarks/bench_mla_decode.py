"""MLA decode benchmark (BWX_MLA kernel vs vLLM 0.32's Triton MLA decode).

Thin script: the logic lives in `vllm_blackwell_ext.bench.mla_decode` so that
`vllm-bwx bench mla_decode` runs the same code.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from vllm_blackwell_ext.bench.mla_decode import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
