#!/usr/bin/env bash
# device call 8b (2026-11-28, H200, the machine of call 8 still warm): call 8's relative-damping step_cost timed out
# at 115 s (FusedLamb's JIT build plus the probe left one round); rerun alone with 220 s
export PYTHONUNBUFFERED=1; timeout 220 scripts/gpu_suite.sh --part step_cost --dtypes bf16 --sample-fractions 0.25 --pass-fractions 0.125 --compute-methods inverse --relative-damping 100 --job-gpus 16 --batches 256 --repeats 2 --budget 210 --out $OUT/d > $OUT/suite_rel.log 2>&1; echo rc=$?
