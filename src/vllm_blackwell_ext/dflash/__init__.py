"""DFlash speculator: config normalisation, checkpoint loading and the vLLM draft model.

Importing this package is cheap (no vLLM, no torch); `dflash.model` is the vLLM adapter.
"""
