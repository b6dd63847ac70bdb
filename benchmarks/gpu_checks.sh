#!/usr/bin/env bash
# Every GPU check of rayshard in one run, for a CUDA machine held for minutes: the device
# feed's tests and benchmark (PyTorch only), then the loader benchmark feeding the GPU
# against Ray Data (needs Ray), the stall diagnosis (rayshard with a GPU step and a host
# step), then the CPU loader benchmark on that machine's cores. Each
# step runs under its own limit and a shared deadline; one that fails is reported and the
# next runs. Logs and JSON land in OUT as they are written, so a run cut short keeps its
# finished steps. Exit status: 0 every step passed, 1 a step failed or was cut for time,
# 2 no CUDA device, 3 torch did not import (or hung) in PYTHON.
#
#   bash benchmarks/gpu_checks.sh [OUT]        (default OUT: gpu-results)
#
# Environment:
#   PYTHON                  the Python with CUDA PyTorch (default python3)
#   RAYSHARD_WHEELS         a folder of wheels to install first (into RAYSHARD_SITE, default
#                           /tmp/rayshard-site) when Ray is not importable: an image with
#                           CUDA PyTorch and no package index (`benchmarks/offline_wheels.py`)
#   RAYSHARD_GPU_BUDGET_S   seconds for the whole run (default 540)
#   RAYSHARD_GPU_DEVICE     cuda (default), or cpu: a smoke run of this script itself at
#                           small sizes, on a machine without a GPU
#   RAYSHARD_GPU_ROWS       rows of the GPU loader benchmark (default 2000000)
set -u
out=${1:-gpu-results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
device=${RAYSHARD_GPU_DEVICE:-cuda}
deadline=$((SECONDS + ${RAYSHARD_GPU_BUDGET_S:-540}))
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
summary="$out/summary.txt"
: >"$summary"
failed=0

note() { echo "$*" | tee -a "$summary"; }

# step NAME CAP_S COMMAND...: run it with at most CAP_S, and no later than the deadline
step() {
    local name=$1 cap=$2
    shift 2
    local left=$((deadline - SECONDS))
    if ((left < 20)); then
        note "$name: skipped, ${left}s of the budget left"
        failed=$((failed + 1))
        return
    fi
    ((cap > left)) && cap=$left
    local began=$SECONDS
    timeout --kill-after=10 "$cap" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    ((rc != 0)) && failed=$((failed + 1))
    note "$name: exit $rc in $((SECONDS - began))s (limit ${cap}s; log $name.log)"
    tail -n 25 "$out/$name.log"
}

timeout 120 "$py" - >"$out/environment.txt" 2>&1 <<'EOF'  # what ran where: in every report
import platform, os
import torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("cuda available", torch.cuda.is_available(), "cpus", os.cpu_count(),
      "usable", len(os.sched_getaffinity(0)), "torch threads", torch.get_num_threads())
try:  # a CPU quota below the core count starves reading threads (None: no quota)
    from rayshard.runtime.cpu_quota import cpu_quota  # what rayshard's threads follow
    print("cpu quota", cpu_quota())
except Exception as error:  # the report goes on without it
    print("cpu quota unknown:", repr(error))
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0))
EOF
cat "$out/environment.txt" | tee -a "$summary"
if ! grep -q "^cuda available" "$out/environment.txt"; then
    note "torch did not import, or hung, in $py (environment.txt above): set PYTHON to the Python with CUDA PyTorch"
    exit 3
fi
if [ "$device" = cuda ] && ! grep -q "cuda available True" "$out/environment.txt"; then
    note "no CUDA device seen by $py: nothing to check (RAYSHARD_GPU_DEVICE=cpu smoke-runs this script)"
    exit 2
fi

if ! timeout 60 "$py" -c "import ray" 2>/dev/null && [ -n "${RAYSHARD_WHEELS:-}" ]; then
    site=${RAYSHARD_SITE:-/tmp/rayshard-site}
    step wheels 120 "$py" -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target "$site" "$RAYSHARD_WHEELS"/*.whl
    export PYTHONPATH="$PYTHONPATH:$site"
fi
note "ray: $(timeout 60 "$py" -c 'import ray; print(ray.__version__)' 2>&1 | tail -n 1)"

if [ "$device" = cuda ]; then
    step gpu_tests 150 "$py" -m pytest -m gpu tests/device -q -rs
    step gpu_feed 150 "$py" benchmarks/gpu_feed.py --device cuda --json "$out/gpu_feed.json"
    rows=${RAYSHARD_GPU_ROWS:-2000000}
    step gpu_loader 330 "$py" -m benchmarks.gpu_loader --rows "$rows" --epochs 3 --step-ms 1 \
        --loaders rayshard,rayshard:4,ray_data --json "$out/gpu_loader.json"
    # Where rayshard stalls on a step slower than its delivery: the step as a GPU kernel
    # plus a host sync, and as a host sleep; the device feed's phases per batch say which.
    step gpu_stall 150 "$py" -m benchmarks.gpu_loader --rows 1000000 --epochs 2 --step-ms 4 \
        --loaders rayshard --host-step --json "$out/gpu_stall.json"
    step loader_bench 330 "$py" -m benchmarks --rows 6000000 --epochs 6 --ray-cpus 16 \
        --loaders raw,rayshard,rayshard_cpus --json "$out/loader_bench.json"
else
    step gpu_tests 150 "$py" -m pytest -m gpu tests/device -q -rs  # (skipped: collected)
    step gpu_feed 150 "$py" benchmarks/gpu_feed.py --quick --device cpu --json "$out/gpu_feed.json"
    step gpu_loader 330 "$py" -m benchmarks.gpu_loader --rows 50000 --epochs 1 --step-ms 1 \
        --loaders rayshard,rayshard:4,ray_data --device cpu --json "$out/gpu_loader.json"
    step gpu_stall 150 "$py" -m benchmarks.gpu_loader --rows 50000 --epochs 1 --step-ms 1 \
        --loaders rayshard --host-step --device cpu --json "$out/gpu_stall.json"
fi
note "done: $SECONDS s, $failed step(s) failed or cut for time"
exit $((failed > 0))
