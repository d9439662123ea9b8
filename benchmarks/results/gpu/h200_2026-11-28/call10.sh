#!/usr/bin/env bash
# device call 10 (2026-11-28, H200, fifth GPU session): the plan's call 1. The GPU tests on e7fd2c2, then the
# library's own method and damping (eigen, relative damping 100) at BERT-Large, bf16 phase 1, beside call 8b's
# inverse method (4.0%)
set -u
export PYTHONUNBUFFERED=1
T=/tmp/g; mkdir -p $T; L=$OUT/suite.log; S=scripts/gpu_suite.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> $L 2>&1
python3 -c "import torch, transformers, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, sys.version)" >> $L 2>&1
echo "== $(date -u +%T) tests" >> $L
timeout 85 $S --part tests --budget 75 --out $T/a >> $L 2>&1; echo "tests rc=$?" >> $L
cp $T/a/gpu_tests.json $OUT/tests.json
echo "== $(date -u +%T) step_cost eigen relative 100" >> $L
timeout 230 $S --part step_cost --dtypes bf16 --sample-fractions 0.25 --pass-fractions 0.125 --compute-methods eigen --relative-damping 100 --job-gpus 16 --batches 256 --repeats 2 --budget 220 --out $T/c >> $L 2>&1; echo "step_cost rc=$?" >> $L
cp $T/c/gpu_step_cost.json $OUT/step_cost_eigen_rel.json; cp $T/c/gpu_step_cost.png $OUT/step_cost_eigen_rel.png
echo "== $(date -u +%T) end" >> $L
