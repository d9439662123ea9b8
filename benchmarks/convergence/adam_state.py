"""Where LAMB's Adam normalisation is on and where its epsilon switches it off, read from a run's checkpoint.

Adam's update is ``m̂ / (√v̂ + eps)``: where √v̂ ≫ eps every element moves by about the learning rate (Adam's
per-element normalisation); where √v̂ ≪ eps the step is ``m̂ / eps``, proportional to the gradient (momentum SGD).
Under K-FAC, LAMB receives preconditioned gradients whose sizes K-FAC chose, and its global-norm pre-normalisation
divides them all by one number, so some tensors can land far below eps (issue 23, 2c: the "step-size" half of
K-FAC's early lead). ``python -m benchmarks.convergence.adam_state RUN_DIR...`` prints, per parameter tensor of each
run's last checkpoint, the share of elements with √v̂ below the group's eps and the median √v̂, and writes them with
``--out``.

Parameter names come from the checkpoint's module state (tied tensors once, in order), split into LAMB's two groups
by BERT's weight-decay rule as :func:`kaisa_ds.optim.weight_decay_groups` applies it (by name here: HF names every
LayerNorm "LayerNorm"); each name's shape is checked against its optimizer state.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from kaisa_ds.optim.param_groups import NO_DECAY_NAME_PARTS

STATE_FILE = "mp_rank_00_model_states.pt"  # DeepSpeed's model and optimizer state of a ZeRO-0 run


@dataclass(frozen=True)
class TensorRegime:
    """One parameter tensor's Adam regime at the checkpoint's step."""

    name: str
    shape: tuple[int, ...]
    below_eps: float  # share of elements with √v̂ < eps, never-updated ones included
    never_updated: float  # share with v̂ = 0: no gradient reached them (e.g. position embeddings past the sequence)
    median_sqrt_v: float


def group_names(module_state: dict[str, torch.Tensor]) -> list[list[str]]:
    """Names of LAMB's two groups (decayed, then exempt) in the order their parameters were given to it: the module's
    parameter order, tied tensors once (by storage), buffers never reach the optimizer so are not in the state."""
    seen: set[int] = set()
    decay: list[str] = []
    no_decay: list[str] = []
    for name, tensor in module_state.items():
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        (no_decay if any(part in name for part in NO_DECAY_NAME_PARTS) else decay).append(name)
    return [names for names in (decay, no_decay) if names]


def adam_regimes(checkpoint: dict[str, Any]) -> list[TensorRegime]:
    """Per parameter tensor: the share of √v̂ below its group's eps and the median √v̂ (bias-corrected as LAMB does)."""
    optimizer = checkpoint["optimizer"]
    groups = optimizer["param_groups"]
    names = group_names(checkpoint["module"])
    if [len(n) for n in names] != [len(g["params"]) for g in groups]:
        raise ValueError(f"the checkpoint's optimizer groups hold {[len(g['params']) for g in groups]} tensors but "
                         f"its module's parameters split into {[len(n) for n in names]}: not a BERT LAMB checkpoint")
    rows: list[TensorRegime] = []
    for group, group_names_ in zip(groups, names):
        correction = 1.0 - group["betas"][1] ** group["step"] if group.get("bias_correction", True) else 1.0
        for pid, name in zip(group["params"], group_names_):
            v = optimizer["state"][pid]["exp_avg_sq"].float()
            if tuple(v.shape) != tuple(checkpoint["module"][name].shape):
                raise ValueError(f"{name}: module shape {tuple(checkpoint['module'][name].shape)} but optimizer state "
                                 f"{tuple(v.shape)}; the name order does not match the optimizer's")
            root = (v / correction).sqrt()
            rows.append(TensorRegime(name=name, shape=tuple(v.shape),
                                     below_eps=float((root < group["eps"]).float().mean()),
                                     never_updated=float((v == 0).float().mean()),
                                     median_sqrt_v=float(root.median())))
    return rows


def latest_state(run_dir: Path) -> Path:
    """The newest step folder's state file under ``run_dir`` (a run folder, its checkpoints folder or a step)."""
    for candidate in (run_dir / STATE_FILE, *sorted(run_dir.glob(f"**/step*/{STATE_FILE}"),
                                                    key=lambda p: int(p.parent.name.removeprefix("step")))[::-1]):
        if candidate.is_file():
            return candidate
    raise SystemExit(f"{run_dir}: no {STATE_FILE} under it (a bert_pretrain run folder with checkpoints is needed)")


def main(argv: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.convergence.adam_state", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+",
                        help="bert_pretrain run folders (their newest checkpoint is read)")
    parser.add_argument("--out", type=Path, help="write every run's rows here as JSON")
    args = parser.parse_args(argv)
    result: dict[str, list[dict[str, Any]]] = {}
    for run_dir in args.runs:
        path = latest_state(run_dir)
        rows = adam_regimes(torch.load(path, map_location="cpu", weights_only=False))
        result[str(path)] = [asdict(r) for r in rows]
        total = sum(torch.Size(r.shape).numel() for r in rows)
        below = sum(r.below_eps * torch.Size(r.shape).numel() for r in rows)
        never = sum(r.never_updated * torch.Size(r.shape).numel() for r in rows)
        print(f"{path}: {below / total:.1%} of {total} elements have √v̂ below eps ({never / total:.1%} never had a "
              "gradient)")
        for r in rows:
            print(f"  {r.name:70s} {r.shape!s:14s} below eps {r.below_eps:6.1%} (never updated "
                  f"{r.never_updated:6.1%})  median √v̂ {r.median_sqrt_v:.2e}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
