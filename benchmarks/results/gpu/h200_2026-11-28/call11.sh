#!/usr/bin/env bash
# device call 11 (2026-11-28, H200, fifth GPU session): BERT-base, never measured on a GPU. What a user gets from
# "kfac": {"enabled": true} on one GPU at a phase-1 micro-batch of 256 x 128 in bf16 with no accumulation: the
# library's defaults (eigen, factors every 5, "auto" decompositions = every 10 at 32,768 rows, every token, grafting,
# relative damping 100), then the inverse method, then KAISA's decomposition interval of 50
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD; L=$OUT/suite.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >> $L 2>&1
M="python3 -m benchmarks.step_cost --size base --dtype bf16 --batch 256 --seq 128 --factor-every 5 --grafting gradient --relative-damping 100 --device cuda --repeats 2"
echo "== $(date -u +%T) eigen every 10 (the defaults)" >> $L
timeout 150 $M --inv-every 10 --decomp-sizes 768 769 3072 3073 --out $OUT/base_defaults.json >> $L 2>&1; echo "rc=$?" >> $L
echo "== $(date -u +%T) inverse every 10" >> $L
timeout 75 $M --inv-every 10 --compute-method inverse --out $OUT/base_inverse.json >> $L 2>&1; echo "rc=$?" >> $L
echo "== $(date -u +%T) eigen every 50" >> $L
timeout 75 $M --inv-every 50 --out $OUT/base_inv50.json >> $L 2>&1; echo "rc=$?" >> $L
echo "== $(date -u +%T) end" >> $L
