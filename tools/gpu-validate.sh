#!/usr/bin/env bash
# One-command validation of the course on a CUDA machine, from the project root:
#   bash tools/gpu-validate.sh [extra pytest arguments]          (OUT=dir for the results; default ./gpu-out)
# 1) installs the wheels carried in .whl/ (if that folder exists: see ../shared/gpu/fetch-wheels.sh) into
#    /tmp/site, 2) records the GPU with `python -m tools.bench --device cuda` (limit BENCH_S, 180 s),
# 3) records an fp8 matmul's speed against bf16 where the GPU has fp8 units (sm_89 on; limit FP8_S, 60 s):
#    tensorwise and rowwise, fast accumulation off and on, and torchao's forward whole (amax, casts, matmul
#    with fast accumulation; eager, so unfused). FP8_DEVICE=cpu dry-runs that Python on a CPU (small sizes).
# 4) runs the whole pytest suite (unit tests + every notebook under nbval) on the GPU (limit PYTEST_S, 270 s).
# Sized to finish in about 9 minutes on an H100-class GPU. Everything it prints is also under $OUT: gpu.txt,
# bench.log, the benchmark JSON (cuda_<gpu name>.json: copy it to data/benchmarks/), fp8.txt, pytest.log,
# junit.xml.
# Kept in step with ../shared/gpu/gpu-validate.sh by tests/test_simulated_gpus.py.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
BENCH_S=${BENCH_S:-180}; PYTEST_S=${PYTEST_S:-270}; FP8_S=${FP8_S:-60}; PYTHON=${PYTHON:-python3}
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
# FP8_DEVICE=cpu runs this same code small on a CPU (a dry run of its logic; its times mean nothing).
import os

import torch

from helpers import timing

device = os.environ.get("FP8_DEVICE", "cuda")
if device == "cuda" and (not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9)):
    print("no fp8 tensor cores (they start at sm_89): nothing to record")
    raise SystemExit(0)
n, round_s = (8192, 0.1) if device == "cuda" else (64, 0.005)
e4m3 = torch.float8_e4m3fn
g = torch.Generator(device=device).manual_seed(0)
a, b = (torch.randn(n, n, device=device, generator=g, dtype=torch.bfloat16) for _ in range(2))


def cast(x, rowwise):
    """x in e4m3 and its float32 scale, amax / 448 (per row or per tensor): torchao's dynamic cast."""
    amax = x.abs().amax(-1, keepdim=True) if rowwise else x.abs().amax()
    scale = amax.float().clamp(min=1e-12) / 448
    return (x / scale).clamp(-448, 448).to(e4m3), scale


def product(qa, sa, qb, sb, fast):
    """qa @ qb.T in fp8 (b column-major, as _scaled_mm takes it), a bf16 result."""
    return torch._scaled_mm(qa, qb.t(), scale_a=sa, scale_b=sb.t(), out_dtype=torch.bfloat16,
                            use_fast_accum=fast)


print(torch.cuda.get_device_name() if device == "cuda" else device, "torch", torch.__version__,
      f"{n}x{n}x{n}, bf16 result, torch._scaled_mm")
for name, rowwise in (("tensorwise", False), ("rowwise", True)):
    qa, sa = cast(a, rowwise)
    qb, sb = cast(b, rowwise)
    variants = {"matmul only, fast accumulation off": lambda: product(qa, sa, qb, sb, False),
                "matmul only, fast accumulation on (torchao's forward)":
                    lambda: product(qa, sa, qb, sb, True),
                "amax + casts + matmul, fast accumulation on (torchao's forward, eager)":
                    lambda: product(*cast(a, rowwise), *cast(b, rowwise), True)}
    try:
        for fp8 in variants.values():
            fp8()
    except (RuntimeError, ValueError) as error:  # ValueError: TORCH_CHECK_VALUE
        print(f"{name}: torch._scaled_mm refused: {str(error).splitlines()[0][:160]}")
        continue
    results = {fast: product(qa, sa, qb, sb, fast).float() for fast in (False, True)}
    reference = a.float() @ b.float().t()
    error = (results[False] - reference).norm() / reference.norm()  # mostly the inputs' rounding
    change = (results[True] - results[False]).norm() / results[False].norm()
    print(f"{name}: relative error {error:.2e} against float32; fast accumulation changes it by {change:.1e}")
    for label, fp8 in variants.items():
        c = timing.compare(lambda: a @ b.t(), fp8, rounds=7, round_s=round_s, device=device)
        tflops = {k: 2 * n**3 / s / 1e12 for k, s in (("bf16", c.baseline_s), ("fp8", c.candidate_s))}
        print(f"{name} fp8 vs bf16, {label}: {c} | bf16 {tflops['bf16']:.0f}, fp8 {tflops['fp8']:.0f} TFLOP/s")
PY
echo "fp8: exit ${PIPESTATUS[0]} in $((SECONDS - start))s"
echo "== pytest on the GPU (limit ${PYTEST_S}s)"
start=$SECONDS
timeout "$PYTEST_S" "$PYTHON" -m pytest -q -p no:cacheprovider -rfE --durations=15 --junitxml="$OUT/junit.xml" "$@" 2>&1 | tee "$OUT/pytest.log" | tail -60
status=${PIPESTATUS[0]}
echo "pytest: exit $status in $((SECONDS - start))s"
exit "$status"
