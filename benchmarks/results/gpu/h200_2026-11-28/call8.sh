#!/usr/bin/env bash
# device call 8 (2026-11-28, H200): the GPU tests; the inverse method after its fix (diagnose, then its cost at the
# absolute 0.001 beside the eigen method, then at the library's relative damping); BERT-mini's step cost on a GPU
set -u
export PYTHONUNBUFFERED=1
T=/tmp/g; mkdir -p $T; L=$OUT/suite.log; S=scripts/gpu_suite.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> $L 2>&1
python3 -c "import torch, transformers, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, sys.version)" >> $L 2>&1
echo "== $(date -u +%T) tests" >> $L
timeout 85 $S --part tests --budget 75 --out $T/a >> $L 2>&1; echo "tests rc=$?" >> $L
cp $T/a/gpu_tests.json $OUT/tests.json
echo "== $(date -u +%T) diagnose" >> $L
timeout 100 $S --part diagnose --pieces effectiveness --cases inverse_bf16_align-default inverse_fp32_align-default --batches 128 --budget 90 --out $T/b >> $L 2>&1; echo "diagnose rc=$?" >> $L
cp $T/b/gpu_diagnose.json $OUT/diagnose.json
echo "== $(date -u +%T) step_cost absolute 0.001" >> $L
timeout 205 $S --part step_cost --dtypes bf16 --sample-fractions 0.25 --pass-fractions 0.125 --compute-methods inverse eigen --job-gpus 16 --batches 256 --repeats 2 --budget 195 --out $T/c >> $L 2>&1; echo "step_cost rc=$?" >> $L
cp $T/c/gpu_step_cost.json $OUT/step_cost.json; cp $T/c/gpu_step_cost.png $OUT/step_cost.png
echo "== $(date -u +%T) step_cost relative 100" >> $L
timeout 115 $S --part step_cost --dtypes bf16 --sample-fractions 0.25 --pass-fractions 0.125 --compute-methods inverse --relative-damping 100 --job-gpus 16 --batches 256 --repeats 2 --budget 105 --out $T/d >> $L 2>&1; echo "step_cost_rel rc=$?" >> $L
cp $T/d/gpu_step_cost.json $OUT/step_cost_rel.json
echo "== $(date -u +%T) mini" >> $L
PYTHONPATH=/tmp/site:$PWD timeout 45 python3 -m benchmarks.step_cost --size mini --batch 256 --seq 32 --inv-every 10 --grafting gradient --relative-damping 100 --device cuda --repeats 3 --out $OUT/mini_step_cost.json >> $L 2>&1; echo "mini rc=$?" >> $L
echo "== $(date -u +%T) end" >> $L
