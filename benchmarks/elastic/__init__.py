"""The sections of `benchmarks/elastic_bench.py`: recovery, coordinator lease rate, epochs."""
