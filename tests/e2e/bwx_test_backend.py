"""A test-only attention backend: vLLM's CPU backend under a new, plugin-registered name.

It proves the named-backend mechanism (a new AttentionBackendEnum member surviving vLLM's
spawned processes) independently of our real backends.
"""

from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend


class BwxTestAttentionBackend(CPUAttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "BWX_TEST"
