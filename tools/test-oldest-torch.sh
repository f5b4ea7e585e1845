#!/usr/bin/env bash
# Run the whole suite (unit tests and every notebook, strict nbval) on the oldest releases the course supports.
#
#   tools/test-oldest-torch.sh [pytest arguments]     e.g.  tools/test-oldest-torch.sh tests/
#
# Builds (or reuses) a virtual environment from requirements-oldest.txt (torch, torchvision and numpy pinned to
# the declared minimum), checks that the pins are what got installed, and runs pytest there. Exits non-zero if
# any test fails or if pytest collected no test at all (pytest's exit status 5). Environment variables:
#   OLDEST_VENV  where the environment lives (default build/venv-oldest; git ignores build/)
#   PYTHON       the interpreter that creates it (default python3; the course needs Python 3.10 or newer)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${OLDEST_VENV:-build/venv-oldest}"

if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
venv="$(cd "$venv" && pwd)"
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"  # as if activated: notebooks that start tools find these
# A machine-wide pip constraints file (PIP_CONSTRAINT) may cap or pin torch; the floor is installed as pinned.
export PIP_CONSTRAINT=""
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r requirements-oldest.txt

# The environment must hold exactly the pinned releases, or this run proves nothing about the floor.
"$venv/bin/python" - <<'PY'
import re
import sys
from pathlib import Path

import numpy
import torch
import torchvision

pins = dict(re.findall(r"^(torch|torchvision)==(\S+)", Path("requirements-oldest.txt").read_text(), re.M))
installed = {"torch": torch.__version__, "torchvision": torchvision.__version__}
wrong = {name: installed[name] for name in pins if installed[name].split("+")[0] != pins[name]}
if wrong or set(pins) != {"torch", "torchvision"}:
    sys.exit(f"requirements-oldest.txt pins {pins}, but this environment has {installed}")
print(f"oldest supported: python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"torchvision {torchvision.__version__}, numpy {numpy.__version__}")
PY

start=$(date +%s)
status=0
"$venv/bin/python" -m pytest "$@" || status=$?
echo "pytest on the oldest supported torch: $(( $(date +%s) - start )) s, exit status $status"
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$status"
