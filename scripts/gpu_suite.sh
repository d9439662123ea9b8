#!/usr/bin/env bash
# The GPU suite on the device machine: install the carried wheels (.whl/, from scripts/build_gpu_wheels.sh), then
# `python -m benchmarks.gpu ARGS`, its output also in <out>/gpu_suite.log. One device call per part set, e.g.
#
#   scripts/gpu_suite.sh --part tests eigh          # run with carry: [".whl"]; files land in $OUT
#   scripts/gpu_suite.sh --cpu-smoke --out /tmp/s   # the CPU dry run: no wheels installed
#
# Exit 2 without a carried wheel (naming the package and the command that builds it) or without CUDA.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHL=${WHL_DIR:-.whl}
SITE=${SITE_DIR:-/tmp/site}
NEEDED="deepspeed hjson pydantic pydantic_core annotated_types typing_inspection typing_extensions"

out=${OUT:-runs/gpu}
smoke=0
prev=""
for arg in "$@"; do
  [ "$prev" = "--out" ] && out=$arg
  [ "$arg" = "--cpu-smoke" ] && smoke=1
  prev=$arg
done

if [ "$smoke" = 0 ]; then
  missing=""
  for pkg in $NEEDED; do
    ls "$WHL/$pkg"-*.whl >/dev/null 2>&1 || missing="$missing $pkg"
  done
  if [ -n "$missing" ]; then
    echo "gpu_suite.sh: no carried wheel for:$missing (looked in $WHL/). Build them on the CPU machine with" \
         "'scripts/build_gpu_wheels.sh' and name .whl in the device call's carry" >&2
    exit 2
  fi
  if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    exec "$PY" -m benchmarks.gpu "$@"  # refuses with its message (exit 2) before anything is installed
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHL"/*.whl \
    || { echo "gpu_suite.sh: installing the wheels of $WHL/ failed (see above)" >&2; exit 2; }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$out"
"$PY" -m benchmarks.gpu "$@" 2>&1 | tee "$out/gpu_suite.log"
exit "${PIPESTATUS[0]}"
