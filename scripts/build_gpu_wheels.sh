#!/usr/bin/env bash
# Build or download into .whl/ (git-ignored) the Python packages the GPU machine lacks, for the device call's
# `carry: [".whl"]`; scripts/gpu_suite.sh installs them there. Run on this (CPU) machine, in the repo:
#
#   scripts/build_gpu_wheels.sh                                   # deepspeed + its missing dependencies
#
# deepspeed ships as a source archive: it becomes a pure-Python wheel with every op left to JIT (DS_BUILD_OPS=0),
# built by the machine's CUDA there. The others are manylinux/py3 wheels for the GPU machine's CPython 3.12
# (benchmarks/README.md, "GPU suite"). The GPU image already has torch, transformers, accelerate, numpy, ninja,
# psutil, py-cpuinfo, msgpack, einops, tqdm, packaging, typing-extensions and pytest; it lacks these:
#   deepspeed hjson pydantic pydantic-core annotated-types typing-inspection (+ typing-extensions: pydantic needs a
# newer one than the image may have)
# Versions are this checkout's .venv's, so the GPU runs the versions the CPU tests ran. `datasets` is not needed:
# no GPU test or part imports it. NVIDIA Apex is not on the package registry and is not built by this project
# (benchmarks/README.md, "GPU suite": what the LAMB selection does without it); its tests run only where it is
# importable.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WHL=${WHL_DIR:-.whl}
LIMIT_MB=40  # the device call carries at most 64 MiB of working tree in all
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {print}' "$0"; exit 0 ;;
    *) echo "build_gpu_wheels.sh: unknown argument '$1' (it takes none)" >&2; exit 2 ;;
  esac
done
mkdir -p "$WHL"
version() { "$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }

ds=$(version deepspeed)
if ! ls "$WHL"/deepspeed-"$ds"-*.whl >/dev/null 2>&1; then
  echo "building deepspeed $ds (pure Python, ops left to JIT)"
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-binary deepspeed -w "$WHL" "deepspeed==$ds"
fi

# manylinux wheels for the GPU machine: CPython 3.12, x86-64 (the device README's recipe)
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for pkg in hjson pydantic pydantic-core annotated-types typing-inspection typing-extensions; do
  v=$(version "$pkg")
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$WHL" "$pkg==$v"
done

# one version of each package (two stop pip's install there), and the size the call will carry
dups=$(ls "$WHL"/*.whl | xargs -n1 basename | cut -d- -f1 | sort | uniq -d)
[ -z "$dups" ] || { echo "build_gpu_wheels.sh: several versions of: $dups in $WHL; delete the old ones" >&2; exit 1; }
ls -l "$WHL"
total_kb=$(du -sk "$WHL" | cut -f1)
echo "total: $((total_kb / 1024)) MiB ($total_kb KiB) in $WHL"
[ "$total_kb" -le $((LIMIT_MB * 1024)) ] || { echo "build_gpu_wheels.sh: over ${LIMIT_MB} MiB" >&2; exit 1; }
