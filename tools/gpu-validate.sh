#!/usr/bin/env bash
# One-command validation of the course on a CUDA machine, from the project root:
#   bash tools/gpu-validate.sh [extra pytest arguments]          (OUT=dir for the results; default ./gpu-out)
# 1) installs the wheels carried in .whl/ (if that folder exists: see ../shared/gpu/fetch-wheels.sh) into
#    /tmp/site, 2) records the GPU with `python -m tools.bench --device cuda` (limit BENCH_S, 180 s),
# 3) records an fp8 matmul's speed against bf16 where the GPU has fp8 units (sm_89 on; limit FP8_S, 30 s),
# 4) runs the whole pytest suite (unit tests + every notebook under nbval) on the GPU (limit PYTEST_S, 270 s).
# Sized to finish in about 8 minutes on an H100-class GPU. Everything it prints is also under $OUT: gpu.txt,
# bench.log, the benchmark JSON (cuda_<gpu name>.json: copy it to data/benchmarks/), fp8.txt, pytest.log,
# junit.xml.
# Kept in step with ../shared/gpu/gpu-validate.sh by tests/test_simulated_gpus.py.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
BENCH_S=${BENCH_S:-180}; PYTEST_S=${PYTEST_S:-270}; FP8_S=${FP8_S:-30}; PYTHON=${PYTHON:-python3}
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
echo "== fp8 matmul vs bf16 (limit ${FP8_S}s; notebook 10)"
start=$SECONDS
timeout "$FP8_S" "$PYTHON" - <<'PY' 2>&1 | tee "$OUT/fp8.txt"
import torch
from helpers import timing
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
    print("no fp8 tensor cores (they start at sm_89): nothing to record")
    raise SystemExit(0)
n, e4m3 = 8192, torch.float8_e4m3fn
g = torch.Generator(device="cuda").manual_seed(0)
a, b = (torch.randn(n, n, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
qa, qb = a.to(e4m3), b.to(e4m3).t()  # row-major a, column-major b: what _scaled_mm takes
scales = {"tensorwise": (torch.ones((), device="cuda"), torch.ones((), device="cuda")),
          "rowwise": (torch.ones(n, 1, device="cuda"), torch.ones(1, n, device="cuda"))}
print(torch.cuda.get_device_name(), "torch", torch.__version__, f"{n}x{n}x{n}, bf16 result")
for name, (sa, sb) in scales.items():
    def fp8():
        return torch._scaled_mm(qa, qb, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    try:
        fp8()
    except RuntimeError as error:
        print(f"{name}: torch._scaled_mm refused: {str(error).splitlines()[0]}")
        continue
    c = timing.compare(lambda: a @ b, fp8, rounds=7, round_s=0.2, device="cuda")
    tflops = {k: 2 * n**3 / s / 1e12 for k, s in (("bf16", c.baseline_s), ("fp8", c.candidate_s))}
    print(f"{name} fp8 vs bf16: {c} | bf16 {tflops['bf16']:.0f}, fp8 {tflops['fp8']:.0f} TFLOP/s")
PY
echo "fp8: exit ${PIPESTATUS[0]} in $((SECONDS - start))s"
echo "== pytest on the GPU (limit ${PYTEST_S}s)"
start=$SECONDS
timeout "$PYTEST_S" "$PYTHON" -m pytest -q -p no:cacheprovider -rfE --durations=15 --junitxml="$OUT/junit.xml" "$@" 2>&1 | tee "$OUT/pytest.log" | tail -60
status=${PIPESTATUS[0]}
echo "pytest: exit $status in $((SECONDS - start))s"
exit "$status"
