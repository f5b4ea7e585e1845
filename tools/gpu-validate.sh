#!/usr/bin/env bash
# One-command validation of the course on a CUDA machine, from the project root:
#   bash tools/gpu-validate.sh [extra pytest arguments]          (OUT=dir for the results; default ./gpu-out)
# 1) installs the wheels carried in .whl/ (if that folder exists: see ../shared/gpu/fetch-wheels.sh) into
#    /tmp/site, 2) records the GPU with `python -m tools.bench --device cuda` (limit BENCH_S, 180 s),
# 3) runs the whole pytest suite (unit tests + every notebook under nbval) on the GPU (limit PYTEST_S, 270 s).
# Sized to finish in under 8 minutes on an H100-class GPU. Everything it prints is also under $OUT: gpu.txt,
# bench.log, the benchmark JSON (cuda_<gpu name>.json: copy it to data/benchmarks/), pytest.log, junit.xml.
# Kept in step with ../shared/gpu/gpu-validate.sh by tests/test_simulated_gpus.py.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
BENCH_S=${BENCH_S:-180}; PYTEST_S=${PYTEST_S:-270}; PYTHON=${PYTHON:-python3}
if [ -d .whl ]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
else
  echo "no .whl/ folder: using the installed packages (pytest, nbval, ipykernel must be there)"
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  "$PYTHON" -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'No CUDA device', torch.cuda.get_device_capability() if torch.cuda.is_available() else '')"
  nproc; } 2>&1 | tee "$OUT/gpu.txt"
echo "== benchmark recorder (limit ${BENCH_S}s)"
start=$SECONDS
timeout "$BENCH_S" "$PYTHON" -m tools.bench --device cuda --out "$OUT" --note "${NOTE:-one-shot GPU validation}" 2>&1 | tee "$OUT/bench.log"
echo "bench: exit ${PIPESTATUS[0]} in $((SECONDS - start))s"
echo "== pytest on the GPU (limit ${PYTEST_S}s)"
start=$SECONDS
timeout "$PYTEST_S" "$PYTHON" -m pytest -q -p no:cacheprovider -rfE --durations=15 --junitxml="$OUT/junit.xml" "$@" 2>&1 | tee "$OUT/pytest.log" | tail -60
status=${PIPESTATUS[0]}
echo "pytest: exit $status in $((SECONDS - start))s"
exit "$status"
