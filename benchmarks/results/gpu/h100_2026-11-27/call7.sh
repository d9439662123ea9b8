#!/usr/bin/env bash
# device call 7 (2026-11-27): is the inverse method's half-precision storage what points away? and fp32's cost
set -u
export PYTHONUNBUFFERED=1
T=/tmp/g; mkdir -p $T; L=$OUT/suite.log; S=scripts/gpu_suite.sh
echo "== $(date -u +%T) diagnose" >> $L
timeout 105 $S --part diagnose --pieces effectiveness --cases inverse_bf16_align-default inverse_fp32_align-default --batches 128 --budget 95 --out $T/b >> $L 2>&1; echo "diagnose rc=$?" >> $L
cp $T/b/gpu_diagnose.json $OUT/diagnose.json
echo "== $(date -u +%T) step_cost" >> $L
timeout 150 $S --part step_cost --dtypes bf16 --sample-fractions 0.25 --pass-fractions 0.125 --compute-methods inverse --inv-dtype fp32 --job-gpus 16 --batches 256 --repeats 2 --budget 140 --out $T/c >> $L 2>&1; echo "step_cost rc=$?" >> $L
cp $T/c/gpu_step_cost.json $OUT/step_cost.json; cp $T/c/gpu_step_cost.png $OUT/step_cost.png
echo "== $(date -u +%T) end" >> $L
