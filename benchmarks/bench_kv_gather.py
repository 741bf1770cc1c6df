"""Paged-KV gather benchmark; same as `vllm-bwx bench kv-gather` (see --help)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout

from vllm_blackwell_ext.bench.kv_gather import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
