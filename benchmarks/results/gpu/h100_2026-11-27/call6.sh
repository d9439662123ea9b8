#!/usr/bin/env bash
# device call 6 (2026-11-27): issue 25's unmeasured figures, each part under its own timeout
set -u
export PYTHONUNBUFFERED=1
T=/tmp/g; mkdir -p $T; L=$OUT/suite.log; S=scripts/gpu_suite.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> $L 2>&1
python3 -c "import torch, transformers, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, sys.version)" >> $L 2>&1
echo "== $(date -u +%T) tests" >> $L
timeout 85 $S --part tests --budget 75 --out $T/a >> $L 2>&1; echo "tests rc=$?" >> $L
cp $T/a/gpu_tests.json $OUT/tests.json
echo "== $(date -u +%T) diagnose" >> $L
timeout 180 $S --part diagnose --batches 128 --budget 170 --out $T/b >> $L 2>&1; echo "diagnose rc=$?" >> $L
cp $T/b/gpu_diagnose.json $OUT/diagnose.json
echo "== $(date -u +%T) step_cost" >> $L
timeout 190 $S --part step_cost --dtypes fp16 --sample-fractions 1 0.25 --pass-fractions 0.125 --compute-methods inverse --job-gpus 16 --batches 256 --repeats 2 --budget 180 --out $T/c >> $L 2>&1; echo "step_cost rc=$?" >> $L
cp $T/c/gpu_step_cost.json $OUT/step_cost.json; cp $T/c/gpu_step_cost.png $OUT/step_cost.png
echo "== $(date -u +%T) accuracy" >> $L
timeout 125 python3 -m benchmarks.accuracy --size large --batch 64 --seq 128 --windows 3 --passes 8 --damping 4.688e-5 --variants 1:fp32 0.25:fp32 0.25:fp32:0.125 --text .gpu_data/valid.txt --vocab .gpu_data/vocab.txt --device cuda --out $OUT/accuracy.json >> $L 2>&1; echo "accuracy rc=$?" >> $L
echo "== $(date -u +%T) end" >> $L
