"""rayshard benchmarks: `python -m benchmarks` runs the loader benchmark
(`benchmarks/loader_bench.py`); `benchmarks/gpu_feed.py` benchmarks the device feed."""
