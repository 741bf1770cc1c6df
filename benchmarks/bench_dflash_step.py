"""DFlash draft-step benchmark (a Qwen3-8B-shaped draft step, our attention vs vLLM 0.32's).

Thin script: the logic lives in `vllm_blackwell_ext.bench.dflash_step` so that
`vllm-bwx bench dflash-step` runs the same code.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from vllm_blackwell_ext.bench.dflash_step import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
