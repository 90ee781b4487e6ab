#!/usr/bin/env bash
# Byte-code for everything on the interpreter's path (stdlib, site-packages, a --system-site-packages venv's base),
# as pip's default install leaves it. Some runner images ship their libraries without byte-code and set
# PYTHONDONTWRITEBYTECODE=1: every Python process then compiles torch from source, ~3 s of each pytest worker's
# start-up (notes/gpu-runs.md, runs 15-16). With PYTHONPYCACHEPREFIX set the files go there and a read-only install
# stays untouched; later processes read them only if that variable is still set and PYTHONDONTWRITEBYTECODE is not.
# Usage: scripts/compile_bytecode.sh [PYTHON]
set -uo pipefail
PY=${1:-python3}
export PYTHONDONTWRITEBYTECODE=  # empty: unset for Python
dirs=$("$PY" -c "import os, sys; print('\n'.join(p for p in sys.path if os.path.isdir(p)))")
# compileall exits 1 when a file does not compile; installed packages ship such files on purpose (test data written
# for other Python versions), so the status says nothing here; the line below says where the byte-code went.
mapfile -t paths <<< "$dirs"
"$PY" -m compileall -q -j 0 "${paths[@]}" > /dev/null 2>&1
where=${PYTHONPYCACHEPREFIX:-"__pycache__ folders beside the sources"}
echo "byte-code for ${#paths[@]} path entries of $PY in $where"
