"""The loaders `benchmarks/loader_bench.py` compares, and its dataset."""
