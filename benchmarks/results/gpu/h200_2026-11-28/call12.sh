#!/usr/bin/env bash
# device call 12 (2026-11-28, H200, fifth GPU session): inv_dtype "auto" (BF16 on CUDA) after call 11 found BERT-base's
# FP32 preconditioning matmuls FLOP-bound (25 ms a plain step, 31% of a LAMB step). The engine's GPU tests with the
# new default, then BERT-base's step cost at the defaults with BF16 decompositions (= "auto" on CUDA), the inverse
# method, and every 50
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD; L=$OUT/suite.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >> $L 2>&1
echo "== $(date -u +%T) engine GPU tests" >> $L
timeout 70 python3 -m pytest tests/gpu/test_engine_gpu.py -m gpu -q -rfEs -p no:cacheprovider >> $L 2>&1; echo "rc=$?" >> $L
M="python3 -m benchmarks.step_cost --size base --dtype bf16 --batch 256 --seq 128 --factor-every 5 --grafting gradient --relative-damping 100 --device cuda --repeats 2 --decomp-sizes --inv-dtype bf16"
echo "== $(date -u +%T) eigen every 10 (the defaults, bf16 decompositions)" >> $L
timeout 95 $M --inv-every 10 --out $OUT/base_defaults_bf16.json >> $L 2>&1; echo "rc=$?" >> $L
echo "== $(date -u +%T) inverse every 10" >> $L
timeout 55 $M --inv-every 10 --compute-method inverse --out $OUT/base_inverse_bf16.json >> $L 2>&1; echo "rc=$?" >> $L
echo "== $(date -u +%T) eigen every 50" >> $L
timeout 55 $M --inv-every 50 --out $OUT/base_inv50_bf16.json >> $L 2>&1; echo "rc=$?" >> $L
echo "== $(date -u +%T) end" >> $L
