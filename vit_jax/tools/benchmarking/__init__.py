"""Benchmarks: this project against the machine's matmul rate and against timm (ours.py, timm_side.py)."""
