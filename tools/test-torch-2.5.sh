#!/usr/bin/env bash
# Run the low-bit unit tests and notebooks 10-11 (strict nbval) on torch 2.5.1, the middle release: its
# `_convert_weight_to_int4pack` takes codes packed two a byte (pytorch#129940) and it has no `_for_cpu` op (2.6),
# so notebook 11 takes its own branch there.
#
#   tools/test-torch-2.5.sh [pytest arguments]     (default: the low-bit tests and notebooks 10-11)
#
# Builds (or reuses) a virtual environment from requirements-2.5.txt, checks the pins, runs pytest there. Exits
# non-zero if any test fails or pytest collected none. TORCH25_VENV: where it lives (default build/venv-2.5);
# PYTHON: the interpreter that creates it (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${TORCH25_VENV:-build/venv-2.5}"
if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
venv="$(cd "$venv" && pwd)"
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
export PIP_CONSTRAINT=""  # a machine-wide constraints file may cap or pin torch
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r requirements-2.5.txt
"$venv/bin/python" - <<'PY'
import re
import sys
from pathlib import Path

import torch
import torchvision

pins = dict(re.findall(r"^(torch|torchvision)==(\S+)", Path("requirements-2.5.txt").read_text(), re.M))
installed = {"torch": torch.__version__, "torchvision": torchvision.__version__}
wrong = {name: installed[name] for name in pins if installed[name].split("+")[0] != pins[name]}
if wrong or set(pins) != {"torch", "torchvision"}:
    sys.exit(f"requirements-2.5.txt pins {pins}, but this environment has {installed}")
print(f"middle release: python {sys.version.split()[0]}, torch {torch.__version__}")
PY
if [ "$#" -eq 0 ]; then
    set -- -q tests/test_nb11.py tests/test_nb10.py notebooks/10_below_16_bits.ipynb \
        notebooks/11_weight_only_int8_int4.ipynb
fi
start=$(date +%s)
status=0
"$venv/bin/python" -m pytest "$@" || status=$?
echo "pytest on torch 2.5: $(( $(date +%s) - start )) s, exit status $status"
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$status"
