#!/usr/bin/env bash
# One call on a GPU box (torch + Triton preinstalled, no network): install the project's other
# dependencies from the wheels in ./.whl (when present), then run every GPU check; results under
# $OUT (default ./device_out). See benchmarks/device_check.md.
#   bash benchmarks/device_check.sh [device_check.py args...]
# On a machine with network, fill ./.whl for the GPU box's Python first:
#   bash benchmarks/device_check.sh --download 3.12
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ "${1:-}" == "--download" ]]; then
    ver=${2:?python version of the GPU box, e.g. 3.12}
    mkdir -p .whl
    "$PY" benchmarks/device_check.py --print-wheels > .whl/requirements.txt
    "$PY" -m pip download --no-deps --only-binary=:all: --python-version "$ver" \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d .whl -r .whl/requirements.txt
    exit 0
fi
if compgen -G ".whl/*.whl" > /dev/null; then
    PIP_BREAK_SYSTEM_PACKAGES=1 "$PY" -m pip install --no-deps --no-index --quiet .whl/*.whl
fi
export OUT=${OUT:-device_out}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec timeout 420 "$PY" benchmarks/device_check.py "$@"
