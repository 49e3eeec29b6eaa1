"""Crafted image files and guarded runners for the decoder fuzz tests and ``benchmarks/fuzz_decode.py``."""
