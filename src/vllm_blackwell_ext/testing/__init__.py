"""Helpers for tests, the demo and benchmarks (tiny local checkpoints, no hub access)."""
