"""Benchmarks that ship with raysim (``raysim bench collect``): measurements, not tests."""
