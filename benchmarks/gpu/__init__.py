"""The GPU suite: one command per part, each sized for one device call of at most 9 minutes.

    python -m benchmarks.gpu --part tests                  # pytest -m gpu tests/gpu (CUDA paths of kaisa_ds)
    python -m benchmarks.gpu --part step_cost --dtypes bf16  # BERT-Large phase-1 step cost, LAMB vs LAMB+K-FAC
    python -m benchmarks.gpu --part eigh                   # eigh of 1024²/4096² factors: loop, batched, streams
    python -m benchmarks.gpu --cpu-smoke --out /tmp/smoke  # every part's code on the CPU at toy shapes

scripts/gpu_suite.sh installs the carried wheels first; benchmarks/README.md ("GPU suite") gives the session plan.
"""
