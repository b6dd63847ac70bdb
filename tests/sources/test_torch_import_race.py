"""A map-style dataset of numpy samples read in the training process with the default
torch format, in a process that has not imported torch: the first epoch starts the
reading threads, then imports torch for the device feed; a reading thread that met the
half-imported module took it for torch and failed on a sample (a false `DataError`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.benchmark_runs import ROOT

SCRIPT = textwrap.dedent("""
    import sys
    import ray
    from rayshard.loader import Loader
    from rayshard.sources.torch_map import TorchMapSource
    from tests.sources.numpy_samples import NumpySamples

    ray.init(address="local", num_cpus=1, include_dashboard=False)
    loader = Loader(TorchMapSource(NumpySamples(64), batch_rows=8), batch_size=8, name="race")
    it = loader.iterator(world_rank=0, world_size=1)  # batch_format="torch"
    assert "torch" not in sys.modules, "imported before the first epoch: nothing to check"
    ids = [int(i) for batch in it for i in batch["id"]]
    assert sorted(ids) == list(range(64)), ids
    loader.shutdown()
    ray.shutdown()
    print("read", len(ids))
""")


def test_a_first_epoch_that_imports_torch_beside_the_reading_threads_reads_whole():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0 and "read 64" in done.stdout, done.stdout + done.stderr[-3000:]
