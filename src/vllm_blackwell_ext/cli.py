"""`vllm-bwx`: doctor (what the plugin offers here), demo (the main job on a tiny local model)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from vllm_blackwell_ext import __version__, components
from vllm_blackwell_ext.demo.command import BACKENDS, DEFAULT_DEMO_DIR, REFERENCE, run_demo
from vllm_blackwell_ext.host_cpu import cpu_summary, cpu_summary_line
from vllm_blackwell_ext.platforms import platform_status
from vllm_blackwell_ext.registration import CPU_OVERRIDE_ENV, parse_cpu_override
from vllm_blackwell_ext.switches import SWITCHES, Switch
from vllm_blackwell_ext.vllm_compat import (
    installed_vllm_version,
    is_supported_vllm,
    supported_vllm_text,
)

# vLLM loads only the plugins this comma list names, when it is set (even to "").
PLUGIN_FILTER_ENV = "VLLM_PLUGINS"


# ----------------------------------------------------------------------------- doctor
def _module_version(name: str) -> str | None:
    try:
        return str(importlib.import_module(name).__version__)
    except Exception:
        return None


def _entry_point_found() -> bool:
    from importlib.metadata import entry_points

    return any(
        ep.value == "vllm_blackwell_ext:register"
        for ep in entry_points(group="vllm.general_plugins")
    )


def _plugin_names() -> list[str]:
    """Names vLLM knows this plugin by (its `vllm.general_plugins` entry points)."""
    from importlib.metadata import entry_points

    return [
        ep.name
        for ep in entry_points(group="vllm.general_plugins")
        if ep.value == "vllm_blackwell_ext:register"
    ]


def environment_report(env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(problems, warnings) the environment causes, each one report line naming the variable.

    A problem stops the plugin (vLLM then refuses the BWX_* backends); a warning names a
    setting that works here but fails in the engine it is meant for.
    """
    problems, warnings = [], []
    if PLUGIN_FILTER_ENV in env:
        allowed = env[PLUGIN_FILTER_ENV].split(",")
        names = _plugin_names() or ["blackwell_ext"]
        if not set(names) & set(allowed):
            problems.append(
                f"{PLUGIN_FILTER_ENV}={env[PLUGIN_FILTER_ENV]!r} does not name this plugin "
                f"({names[0]!r}): vLLM never calls its register(), and then refuses BWX_ATTN / "
                f"BWX_MLA as unknown backends; add {names[0]!r} to the list or unset it"
            )
    try:
        cpu_overrides = parse_cpu_override(env.get(CPU_OVERRIDE_ENV))
    except ValueError as exc:
        problems.append(str(exc))
        cpu_overrides = ()
    for switch in SWITCHES:
        try:
            switch.enabled(env)
        except ValueError as exc:
            problems.append(str(exc))
    if cpu_overrides and env.get("TRITON_INTERPRET") != "1":
        warnings.append(
            f"{CPU_OVERRIDE_ENV}={env[CPU_OVERRIDE_ENV]!r} without TRITON_INTERPRET=1: a CPU "
            "engine then finds no Triton driver for our kernels and stops ('0 active "
            "drivers'); the CPU path runs them under TRITON_INTERPRET=1"
        )
    return problems, warnings


def mla_decode_plans(info: Any) -> dict[str, str]:
    """The MLA decode plan BWX_MLA makes on this device for a DeepSeek-shaped step (128 heads,
    64 requests at 32k over vLLM's 64-token pages), per cache dtype: variant, tiles, splits."""
    import torch

    from vllm_blackwell_ext.kernels.device import MIN_FP8_CAPABILITY
    from vllm_blackwell_ext.kernels.mla_decode import (
        PREFERRED_BLOCK_SIZE,
        device_reads_tma,
        plan_mla_decode,
    )

    page = PREFERRED_BLOCK_SIZE if device_reads_tma(info) else None
    dtypes = {"bf16": torch.bfloat16}
    if info.capability >= MIN_FP8_CAPABILITY:
        dtypes["fp8"] = torch.float8_e4m3fn
    return {
        f"{tag} cache, 128 heads, B=64 x 32k": plan_mla_decode(
            64, 128, 32768, 1, info, kv_dtype=kv, tma_page_size=page
        ).describe()
        for tag, kv in dtypes.items()
    }


def paged_attention_plans(info: Any) -> dict[str, str]:
    """The plans BWX_ATTN makes on this device for a Qwen3-8B-shaped layer (32 query and 8 KV
    heads of 128) over its preferred pages: decode, verify and prefill, bf16 and fp8 caches."""
    import torch

    from vllm_blackwell_ext.kernels.device import MIN_FP8_CAPABILITY
    from vllm_blackwell_ext.kernels.paged_attention import (
        AttnShape,
        plan_paged_attention,
        preferred_block_size,
    )

    page = preferred_block_size(info.device_class, 16)
    dtypes = {"bf16": torch.bfloat16}
    if info.capability >= MIN_FP8_CAPABILITY:
        dtypes["fp8"] = torch.float8_e4m3fn
    steps = {"decode B=64 x 32k": (64, 1), "verify q=16 B=8 x 32k": (128, 16)}
    steps["prefill 8k"] = (8192, 8192)
    report = {}
    for tag, kv in dtypes.items():
        shape = AttnShape.for_cache(
            info, q_dtype=torch.bfloat16, kv_dtype=kv, num_q_heads=32, num_kv_heads=8,
            head_size=128, head_size_v=128, block_size=page, tma_readable=True,
        )  # fmt: skip
        for step, (tokens, q_len) in steps.items():
            plan = plan_paged_attention(
                shape, num_tokens=tokens, max_seqlen_q=q_len, max_seqlen_k=32768
            )
            report[f"{tag} cache, {step}, pages of {page}"] = plan.describe()
    return report


def _device_report() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"available": False, "why": "torch is not installed"}
    if not torch.cuda.is_available():
        return {"available": False, "why": "no CUDA device visible to torch"}
    from vllm_blackwell_ext.kernels.device import device_info

    info = device_info(torch.cuda.current_device())
    return {
        "available": True,
        "name": info.name,
        "capability": f"{info.capability[0]}.{info.capability[1]}",
        "device_class": info.device_class,
        "num_sms": info.num_sms,
        "smem_per_block": info.smem_per_block,
        "paged_attention": paged_attention_plans(info),
        "mla_decode": mla_decode_plans(info),
    }


def _backend_status(entry: components.BackendEntry, vllm_ok: bool, dev: dict) -> str:
    module = entry.class_path.rsplit(".", 1)[0]
    if not components.module_exists(module):
        return "no: not part of this build"
    if not vllm_ok:
        return f"no: needs vLLM {supported_vllm_text()}"
    if not dev.get("available"):
        return (
            "no GPU: only the CPU test path (TRITON_INTERPRET=1 with "
            f"{CPU_OVERRIDE_ENV}) can run it here"
        )
    major = int(dev["capability"].split(".")[0])
    if major < 8:
        return f"no: compute capability {dev['capability']} < 8.0"
    return "yes"


def _ops_report() -> dict[str, Any]:
    if not components.module_exists(components.OPS_MODULE):
        return {"available": [], "why": "ops module not part of this build"}
    try:
        importlib.import_module(components.OPS_MODULE)
        import torch

        namespace = torch.ops.vllm_blackwell_ext
        found = [op for op in components.OPS if hasattr(namespace, op)]
        return {"available": [f"torch.ops.vllm_blackwell_ext.{op}" for op in found]}
    except Exception as exc:
        return {"available": [], "why": f"{type(exc).__name__}: {exc}"}


def doctor_report(env: Mapping[str, str] | None = None) -> tuple[dict[str, Any], bool]:
    env = os.environ if env is None else env
    problems, warnings = environment_report(env)
    vllm_version = installed_vllm_version()
    vllm_ok = is_supported_vllm(vllm_version)
    report: dict[str, Any] = {
        "plugin": __version__,
        "vllm": vllm_version or "not installed",
        "vllm_supported": vllm_ok,
        "supported_vllm": supported_vllm_text(),
        "torch": _module_version("torch") or "not installed",
        "triton": _module_version("triton") or "not installed",
        "entry_point_found": _entry_point_found(),
        "host_cpu": cpu_summary(),
        "problems": problems,
        "warnings": warnings,
    }
    registered: dict[str, Any] = {}
    register_error = None
    if vllm_ok and not problems:
        try:
            from vllm_blackwell_ext import register, registered_components

            register()
            registered = registered_components()
        except Exception as exc:
            register_error = f"{type(exc).__name__}: {exc}"
    report["registered"] = registered
    if register_error:
        report["register_error"] = register_error
    report["ops"] = _ops_report()
    report["switches"] = {switch.name: _switch_state(switch, env) for switch in SWITCHES}
    report["platform"] = platform_status(env) if vllm_ok else "vLLM's own (unsupported vLLM)"
    report["device"] = _device_report()
    report["backends"] = {
        b.name: {
            "class": b.class_path,
            "what": b.summary,
            "runs_here": _backend_status(b, vllm_ok, report["device"]),
        }
        for b in components.BACKENDS
    }
    report["draft_models"] = components.available_models() if not problems else {}
    can_register = (
        vllm_ok and register_error is None and report["entry_point_found"] and not problems
    )
    return report, can_register


def _switch_state(switch: Switch, env: Mapping[str, str]) -> str:
    try:
        return switch.describe(env)
    except ValueError:
        return "not valid (see the problem below)"


def _print_doctor(report: dict[str, Any], ok: bool) -> None:
    rows = [
        ("vllm-blackwell-ext", report["plugin"]),
        ("vLLM", f"{report['vllm']} (supported: {report['supported_vllm']})"),
        ("torch", report["torch"]),
        ("Triton", report["triton"]),
        ("entry point", "found" if report["entry_point_found"] else "NOT FOUND (reinstall)"),
        ("platform", report["platform"]),
        ("host CPU", cpu_summary_line()),
    ]
    dev = report["device"]
    if dev.get("available"):
        rows.append(
            (
                "device",
                f"{dev['name']} (sm{dev['capability'].replace('.', '')}, "
                f"{dev['num_sms']} SMs, {dev['smem_per_block']} B smem/block)",
            )
        )
        for case, plan in dev.get("paged_attention", {}).items():
            rows.append((f"BWX_ATTN ({case})", plan))
        for case, plan in dev.get("mla_decode", {}).items():
            rows.append((f"MLA decode ({case})", plan))
    else:
        rows.append(("device", f"none: {dev['why']}"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print("\nregistered with vLLM:")
    reg = report["registered"]
    if not reg:
        why = report.get("register_error") or (
            "vLLM missing or unsupported"
            if not report["vllm_supported"]
            else "see the problems below"
            if report["problems"]
            else "nothing"
        )
        print(f"  (nothing: {why})")
    for name, path in reg.get("backends", {}).items():
        print(f"  backend {name:<10} -> {path}")
    for member, path in reg.get("cpu_overrides", {}).items():
        print(f"  CPU override {member} -> {path}  ({CPU_OVERRIDE_ENV})")
    for arch, path in reg.get("models", {}).items():
        print(f"  draft model {arch} -> {path}")
    for method, path in reg.get("speculative_methods", {}).items():
        print(f"  speculative method {method} -> {path}")
    ops = report["ops"]
    print("\nops: " + (", ".join(ops["available"]) or f"none ({ops.get('why', '')})"))
    print("\nswitches:")
    for name, state in report["switches"].items():
        print(f"  {name:<24} {state}")
    print("\nbackends:")
    for name, info in report["backends"].items():
        print(f"  {name:<9} runs here: {info['runs_here']}")
    for line in report["problems"]:
        print(f"\nproblem: {line}")
    for line in report["warnings"]:
        print(f"\nwarning: {line}")
    print("\nstatus: " + ("OK" if ok else "the plugin cannot register here"))


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm-bwx", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="what the plugin offers on this machine")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    demo = sub.add_parser("demo", help="run a tiny local model through vLLM with the plugin")
    demo.add_argument("--model-dir", default=str(DEFAULT_DEMO_DIR), help="where to build it")
    demo.add_argument(
        "--backend",
        default="BWX_ATTN",
        choices=BACKENDS,
        help=f"attention backend to serve the model with (compared with {REFERENCE})",
    )
    demo.add_argument("--max-tokens", type=int, default=12)
    demo.add_argument("--json", action="store_true", help="also print the raw results")
    demo.add_argument("--verbose", action="store_true", help="show vLLM's log as it runs")
    args = parser.parse_args(argv)

    if args.command == "doctor":
        report, ok = doctor_report()
        if args.json:
            print(json.dumps({**report, "ok": ok}, indent=2))
        else:
            _print_doctor(report, ok)
        return 0 if ok else 1
    return run_demo(
        args.model_dir,
        args.backend,
        args.max_tokens,
        verbose=args.verbose,
        print_json=args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
