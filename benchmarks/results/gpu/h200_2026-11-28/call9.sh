#!/usr/bin/env bash
# device call 9 (2026-11-28, H200): BERT-mini's K-FAC step cost on a GPU under the defaults cost 2.34x a LAMB step
# (call 8: the decompositions, 80%); what moves it: damped inverses, a longer decomposition interval, a GPU-sized batch
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD; L=$OUT/suite.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >> $L 2>&1
M="python3 -m benchmarks.step_cost --size mini --seq 32 --grafting gradient --relative-damping 100 --device cuda --repeats 3 --decomp-sizes 256"
echo "== $(date -u +%T) inverse" >> $L
timeout 75 $M --batch 256 --inv-every 10 --compute-method inverse --out $OUT/mini_inverse.json >> $L 2>&1; echo "rc=$?" >> $L
echo "== $(date -u +%T) eigen inv-every 50" >> $L
timeout 35 $M --batch 256 --inv-every 50 --out $OUT/mini_inv50.json >> $L 2>&1; echo "rc=$?" >> $L
echo "== $(date -u +%T) eigen batch 2048" >> $L
timeout 40 $M --batch 2048 --inv-every 10 --out $OUT/mini_b2048.json >> $L 2>&1; echo "rc=$?" >> $L
echo "== $(date -u +%T) end" >> $L
