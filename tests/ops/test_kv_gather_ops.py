"""The torch custom ops `vllm_blackwell_ext::{gather_and_maybe_dequant_cache, cp_gather_cache}`:
registration, schema, fake impls (torch.compile) and bad input (vLLM signature parity is in
tests/plugin/test_ops_match_vllm.py: kernel and op tests import nothing from vLLM)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vllm_blackwell_ext import ops
from vllm_blackwell_ext.kernels import kv_gather as kvk
from vllm_blackwell_ext.reference.kv_gather import gather_and_maybe_dequant_cache_ref

I32 = torch.int32


def small_args(device, kv="fp8", dst_dtype=torch.float32):
    """A valid call: 2 sequences (5 and 11 tokens), block size 4, entry 64."""
    gen = torch.Generator().manual_seed(0)
    vals = torch.randn(8, 4, 64, generator=gen) * 2
    src = vals.to(torch.float8_e4m3fn).view(torch.uint8) if kv == "fp8" else vals.to(torch.bfloat16)
    return dict(
        src_cache=src.to(device),
        dst=torch.zeros(20, 64, dtype=dst_dtype, device=device),
        block_table=torch.tensor([[3, 1, 7, 0], [2, 5, 6, 4]], dtype=I32, device=device),
        cu_seq_lens=torch.tensor([0, 5, 16], dtype=I32, device=device),
        token_to_seq=torch.tensor([0] * 5 + [1] * 11, dtype=I32, device=device),
        num_tokens=16,
        kv_cache_dtype=kv,
        scale=torch.tensor([0.5], device=device),
        seq_starts=torch.tensor([2, 3], dtype=I32, device=device),
    )


def cp_args(device):
    a = small_args(device, kv="auto", dst_dtype=torch.bfloat16)
    return dict(
        src_cache=a["src_cache"],
        dst=a["dst"],
        block_table=a["block_table"],
        cu_seq_lens=a["cu_seq_lens"],
        batch_size=2,
        seq_starts=a["seq_starts"],
    )


def test_importing_ops_registers_both_ops_and_reimport_is_harmless():
    importlib.reload(ops)  # a second registration attempt must not raise
    assert hasattr(torch.ops.vllm_blackwell_ext, "gather_and_maybe_dequant_cache")
    assert hasattr(torch.ops.vllm_blackwell_ext, "cp_gather_cache")


@pytest.mark.parametrize("name", ["gather_and_maybe_dequant_cache", "cp_gather_cache"])
def test_schema_declares_only_dst_as_written(name):
    schema = getattr(torch.ops.vllm_blackwell_ext, name).default._schema
    written = [
        a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write
    ]
    assert written == ["dst"]
    assert [r.type for r in schema.returns] == []


def test_op_matches_the_oracle_through_the_dispatcher(device):
    a = small_args(device)
    ops.gather_and_maybe_dequant_cache(**a)
    ref = torch.zeros_like(a["dst"])
    gather_and_maybe_dequant_cache_ref(**{**a, "dst": ref})
    assert torch.equal(a["dst"], ref)


@pytest.mark.parametrize("which", ["gather", "cp"])
def test_opcheck_passes(which, device):
    if which == "gather":
        a = small_args(device)
        op = torch.ops.vllm_blackwell_ext.gather_and_maybe_dequant_cache.default
    else:
        a = cp_args(device)
        op = torch.ops.vllm_blackwell_ext.cp_gather_cache.default
    torch.library.opcheck(op, (), a)  # schema, autograd registration, fake tensor, AOT dispatch


def test_compiled_caller_traces_through_the_fake_impl(device):
    a = small_args(device)

    def step(src, dst, bt, cu, t2s, scale, starts):
        ops.gather_and_maybe_dequant_cache(src, dst, bt, cu, t2s, 16, "fp8", scale, starts)
        return dst * 2

    args = (
        a["src_cache"],
        a["dst"],
        a["block_table"],
        a["cu_seq_lens"],
        a["token_to_seq"],
        a["scale"],
        a["seq_starts"],
    )
    want = step(*args).clone()
    a["dst"].zero_()
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(*args)
    assert torch.equal(got, want) and torch.equal(a["dst"] * 2, want)


def test_compiled_caller_with_a_dynamic_token_count(device):
    # Under dynamic shapes num_tokens is a symbol: the fake checks everything else, the real
    # call checks it; each count gathers exactly its rows.
    a = small_args(device)
    step = torch.compile(
        lambda src, dst, bt, cu, t2s, n, scale, starts: ops.gather_and_maybe_dequant_cache(
            src, dst, bt, cu, t2s, n, "fp8", scale, starts
        ),
        fullgraph=True,
        dynamic=True,
        backend="aot_eager",
    )
    for n in (16, 12, 9):
        got = torch.zeros_like(a["dst"])
        step(a["src_cache"], got, a["block_table"], a["cu_seq_lens"], a["token_to_seq"], n,
             a["scale"], a["seq_starts"])  # fmt: skip
        want = torch.zeros_like(a["dst"])
        gather_and_maybe_dequant_cache_ref(**{**a, "dst": want, "num_tokens": n})
        assert torch.equal(got, want), n


def test_the_fake_checks_all_but_a_symbolic_token_count(device):
    # What tracing sees: num_tokens is a symbol (here a stand-in object), the rest is checked.
    # The fake impl is exactly this call (`symbolic_tokens` set when num_tokens is no int).
    a = small_args(device)
    symbol = object()

    def fake(**kw):
        kvk.check_gather(**kw, symbolic_tokens=True)

    fake(**{**a, "num_tokens": symbol})  # a valid call passes
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        fake(**{**a, "num_tokens": symbol, "kv_cache_dtype": "fp4"})
    with pytest.raises(TypeError, match="block_table"):
        fake(**{**a, "num_tokens": symbol, "block_table": a["block_table"].long()})


def _bad_gather_cases():
    cases = {
        "block_table int64": (
            "block_table",
            TypeError,
            lambda a: {"block_table": a["block_table"].long()},
        ),
        "cu_seq_lens on meta": (
            "cu_seq_lens",
            ValueError,
            lambda a: {"cu_seq_lens": a["cu_seq_lens"].to("meta")},
        ),
        "token_to_seq float": (
            "token_to_seq",
            TypeError,
            lambda a: {"token_to_seq": a["token_to_seq"].float()},
        ),
        "seq_starts int64": (
            "seq_starts",
            TypeError,
            lambda a: {"seq_starts": a["seq_starts"].long()},
        ),
        "dst too small": ("dst", ValueError, lambda a: {"dst": a["dst"][:10]}),
        "entry mismatch": (
            "dst",
            ValueError,
            lambda a: {"dst": torch.zeros(20, 32, device=a["dst"].device)},
        ),
        "dst int": ("dst", TypeError, lambda a: {"dst": a["dst"].to(torch.int32)}),
        "unknown kv dtype": ("kv_cache_dtype", ValueError, lambda a: {"kv_cache_dtype": "fp4"}),
        "fp8 without scale": ("scale", ValueError, lambda a: {"scale": None}),
        "fp16 scale": ("scale", TypeError, lambda a: {"scale": a["scale"].half()}),
        "2-element scale": ("scale", TypeError, lambda a: {"scale": a["scale"].repeat(2)}),
        "cu_seq_lens too short": (
            "cu_seq_lens",
            ValueError,
            lambda a: {"cu_seq_lens": a["cu_seq_lens"][:2]},
        ),
        "negative num_tokens": ("num_tokens", ValueError, lambda a: {"num_tokens": -1}),
        "token_to_seq too short": (
            "token_to_seq",
            ValueError,
            lambda a: {"token_to_seq": a["token_to_seq"][:4]},
        ),
        "fp8 cache as auto": ("src_cache", TypeError, lambda a: {"kv_cache_dtype": "auto"}),
        "bf16 cache as fp8": (
            "src_cache",
            TypeError,
            lambda a: {"src_cache": a["src_cache"].to(torch.bfloat16)},
        ),
        "block_table 1-D": (
            "block_table",
            ValueError,
            lambda a: {"block_table": a["block_table"][0]},
        ),
        "seq_starts too short": (
            "seq_starts",
            ValueError,
            lambda a: {"seq_starts": a["seq_starts"][:1]},
        ),
        "empty entries": (
            "src_cache",
            ValueError,
            lambda a: {
                "src_cache": a["src_cache"][..., :0],
                "dst": torch.zeros(20, 0, device=a["dst"].device),
            },
        ),
    }
    return [pytest.param(*v, id=k) for k, v in cases.items()]


@pytest.mark.parametrize("arg,exc,change", _bad_gather_cases())
@pytest.mark.parametrize("entry", ["python", "torch.ops"])
def test_bad_gather_input_names_the_argument_and_writes_nothing(arg, exc, change, entry, device):
    a = small_args(device)
    a.update(change(a))
    before = a["dst"].clone() if a["dst"].device.type != "meta" else None
    fn = (
        ops.gather_and_maybe_dequant_cache
        if entry == "python"
        else torch.ops.vllm_blackwell_ext.gather_and_maybe_dequant_cache
    )
    with pytest.raises(exc, match=arg):
        fn(**a)
    if before is not None:
        assert torch.equal(a["dst"], before)


@pytest.mark.parametrize(
    "arg,exc,change",
    [
        pytest.param("dst", TypeError, lambda a: {"dst": a["dst"].float()}, id="dtype differs"),
        pytest.param("batch_size", ValueError, lambda a: {"batch_size": -1}, id="negative batch"),
        pytest.param(
            "cu_seq_lens",
            ValueError,
            lambda a: {"cu_seq_lens": a["cu_seq_lens"][:2]},
            id="cu short",
        ),
        pytest.param(
            "block_table",
            ValueError,
            lambda a: {"block_table": a["block_table"][:1]},
            id="bt short",
        ),
        pytest.param(
            "cu_seq_lens",
            TypeError,
            lambda a: {"cu_seq_lens": a["cu_seq_lens"].long()},
            id="cu int64",
        ),
        pytest.param(
            "src_cache",
            TypeError,
            lambda a: {
                "src_cache": a["src_cache"].to(torch.complex64),
                "dst": a["dst"].to(torch.complex64),
            },
            id="complex",
        ),
    ],
)
def test_bad_cp_gather_input_names_the_argument(arg, exc, change, device):
    a = cp_args(device)
    a.update(change(a))
    with pytest.raises(exc, match=arg):
        ops.cp_gather_cache(**a)


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_bytes_are_read_as_kv_cache_dtype_says_whatever_dtype_views_them(kv, device):
    # vLLM hands MLA caches over viewed as its platform's fp8 dtype (e4m3), e5m2 ones too.
    outs = []
    for view in (torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2):
        a = small_args(device)
        a.update(src_cache=a["src_cache"].view(view), kv_cache_dtype=kv)
        ops.gather_and_maybe_dequant_cache(**a)
        outs.append(a["dst"])
    a = small_args(device)
    want = torch.zeros_like(a["dst"])
    gather_and_maybe_dequant_cache_ref(**{**a, "dst": want, "kv_cache_dtype": kv})
    assert want.abs().sum() > 0
    for out in outs:
        assert torch.equal(out, want)


def test_cpu_tensors_without_the_interpreter_are_refused_by_name(tmp_path):
    # Compiled Triton cannot take CPU tensors: say which argument and why, not "0 active drivers".
    code = (
        "import torch\n"
        "from tests.ops.test_kv_gather_ops import small_args\n"
        "from vllm_blackwell_ext import ops\n"
        "try:\n"
        "    ops.gather_and_maybe_dequant_cache(**small_args('cpu'))\n"
        "except ValueError as e:\n"
        "    print('refused:', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    repo = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(repo), str(repo / "src")])
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=repo, capture_output=True, text=True, timeout=300
    )
    assert "refused: src_cache: expected a CUDA tensor" in done.stdout, done.stdout + done.stderr


def test_debug_bounds_env_checks_block_table_through_the_op(device, monkeypatch):
    a = small_args(device)
    a["block_table"][1, 2] = 8  # == num_blocks; sequence 1 reads block 2 (positions 8..11)
    monkeypatch.setenv(kvk.DEBUG_BOUNDS_ENV, "1")
    with pytest.raises(ValueError, match="block_table"):
        ops.gather_and_maybe_dequant_cache(**a)


def test_debug_bounds_env_reports_cp_gather_rows_past_dst(device, monkeypatch):
    # Without the check the kernel skips rows past dst (never writes out of bounds); the debug
    # mode exists to say so instead.
    a = cp_args(device)
    a["dst"] = a["dst"][:12]  # the sequences need 16 rows
    ops.cp_gather_cache(**a)
    monkeypatch.setenv(kvk.DEBUG_BOUNDS_ENV, "1")
    with pytest.raises(ValueError, match=r"cu_seq_lens: expected a last entry <= dst's 12 rows"):
        ops.cp_gather_cache(**a)
