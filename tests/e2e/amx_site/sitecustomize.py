"""Every Python process started with this folder on PYTHONPATH (a server, its engine core, its
spawned workers) asks Linux for AMX tile data at start (`tests/e2e/amx_tile_data.py` says why)."""

from tests.e2e.amx_tile_data import request_amx_tile_data

request_amx_tile_data()
