"""Every Python process started with this folder on PYTHONPATH (a server, its engine core, its
spawned workers) asks Linux for AMX tile data at start (`amx_tile_data.py` beside it says why).
Self-contained: the processes need nothing else of the checkout on their path."""

from amx_tile_data import request_amx_tile_data

request_amx_tile_data()
