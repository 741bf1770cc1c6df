"""The benchmarks' loader of vLLM's kernel files (`benchmarks/vllm_peer.py`): what it refuses, and
that a kernel file importing vLLM's modules loads through its stand-ins (a fresh interpreter,
since the stand-ins take the `vllm` name)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.vllm_peer import FETCH_HINT, load_vllm_peer

REPO = Path(__file__).resolve().parents[2]  # `python -c` finds `benchmarks` from here
KERNEL_FILE = """
from vllm.platforms import current_platform
from vllm.triton_utils import tl, triton
from vllm.v1.kv_cache_interface import KVQuantMode

@triton.jit
def _add_one(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr) + 1)

FP8 = current_platform.fp8_dtype()
MODE = KVQuantMode.FP8_PER_TENSOR
"""


def test_a_missing_copy_is_refused_with_the_command_that_makes_it(tmp_path):
    # A fresh interpreter: where this process imported vLLM, its own kernels would serve.
    script = textwrap.dedent(f"""
        from benchmarks.vllm_peer import PeerMissing, load_vllm_peer
        try:
            load_vllm_peer({str(tmp_path / "nowhere")!r})
        except PeerMissing as e:
            print(e)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert FETCH_HINT in done.stdout and "fetch_vllm_peer.sh" in FETCH_HINT


def test_a_kernel_file_loads_through_the_stand_ins(tmp_path):
    ops = tmp_path / "vllm" / "v1" / "attention" / "ops"
    ops.mkdir(parents=True)
    for d in (tmp_path / "vllm", ops.parent.parent, ops.parent, ops):
        (d / "__init__.py").write_text("")
    (ops / "toy_kernel.py").write_text(KERNEL_FILE)
    script = textwrap.dedent(f"""
        import sys
        from benchmarks.vllm_peer import load_vllm_peer
        load_vllm_peer({str(tmp_path)!r})
        from vllm.v1.attention.ops.toy_kernel import FP8, MODE, _add_one
        print(FP8, int(MODE), _add_one.fn.__name__)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["torch.float8_e4m3fn", "1", "_add_one"]


def test_a_process_with_vllm_imported_takes_vllms_own_kernel_files(tmp_path):
    # Where vLLM is installed and imported (the GPU kit), no stand-in shadows it: the peer is
    # vLLM's own kernel file, whatever `peer_dir` holds.
    pytest.importorskip("vllm")
    import vllm

    load_vllm_peer(str(tmp_path / "nowhere"))
    assert sys.modules["vllm"] is vllm
    from vllm.v1.attention.ops import triton_unified_attention

    assert triton_unified_attention.__file__.startswith(vllm.__path__[0])
