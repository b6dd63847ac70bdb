"""`python -m benchmarks [options]`: the loader benchmark (see `benchmarks/loader_bench.py`)."""

import sys

from benchmarks.loader_bench import main

if __name__ == "__main__":
    sys.exit(main())
