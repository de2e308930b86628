#!/usr/bin/env bash
# The whole device run for a lent GPU, from the repository root: install satcore from this checkout (no
# network there: no dependencies are fetched, the image has them), then bench/device_run.py, whose figures
# land in $OUT/device_run.json (the device tool brings $OUT back), then merge them here with
#   python -m bench.device_run --merge <files_at>/device_run.json && python -m bench.render_doc
# Sized for under 8 minutes of device time with the machine's start: the script itself stops starting
# parts past --budget-s (default 400 s). Extra arguments go to bench/device_run.py.
set -uo pipefail
OUT=${OUT:-/tmp/device_run}
mkdir -p "$OUT"
if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index --no-cache-dir . >"$OUT/pip.log" 2>&1; then
    echo "pip install failed (see pip.log): running from the checkout"
    export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/nvidia_smi.csv"
PYTHONUNBUFFERED=1 timeout 450 python3 -m bench.device_run --out "$OUT/device_run.json" "$@" 2>&1 | tee "$OUT/device_run.log"
