"""The two training regimes and their tuning grids, and the DeepSpeed configs each run trains with.

Small batch: BERT-mini-sized steps of ~32 sequences, the regime the CPU notes describe. Large batch: 256
sequences per optimizer step through gradient accumulation (shorter sequences, fewer steps), the regime K-FAC is
meant for. Both optimizers get the same tuning budget: LAMB's grid (learning rate × warmup) and K-FAC's grid
(damping × learning-rate scale × update intervals) have the same number of runs, each of ``tune_steps`` steps.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kaisa_ds.optim import APEX_EPS, APEX_MAX_GRAD_NORM

REPO = Path(__file__).resolve().parents[2]
LAMB_CONFIG = REPO / "ds_configs" / "bert_tiny_phase1.json"
KFAC_CONFIG = REPO / "ds_configs" / "bert_tiny_phase1_kfac.json"
RANKS = 2


@dataclass(frozen=True)
class Regime:
    """Model, batch and run length of one regime, and its tuning grids."""

    name: str
    model_size: str
    seq: int  # tokens per sequence
    max_predictions: int  # masked tokens per sequence at most
    micro_batch: int  # sequences per rank per forward/backward
    gas: int  # micro-batches accumulated per optimizer step
    steps: int  # optimizer steps of each final run
    tune_steps: int  # optimizer steps of each tuning run
    eval_every: int
    eval_examples: int
    lamb_lrs: tuple[float, ...]
    warmups: tuple[float, ...]  # warmup proportions of the PolyWarmUp schedule
    dampings: tuple[float, ...]
    kfac_lr_scales: tuple[float, ...]  # K-FAC's lr = LAMB's chosen lr × scale (engine lr; kfac.lr is not set)
    intervals: tuple[tuple[int, int], ...]  # (factor_update_steps, inv_update_steps)
    dupe_factor: int = 5
    ranks: int = RANKS
    # default --text: files under ../shared/data whose pooled articles are split into train / tune / report
    texts: tuple[str, ...] = ("wikitext-2/valid.txt",)
    # kfac keys the final runs set on top of the tuned ones: cost levers picked from benchmarks.accuracy's curve
    # before any final run, not by tuning (the tuning runs used the shipped section's)
    final_kfac: tuple[tuple[str, Any], ...] = ()
    notes: str = field(default="", compare=False)

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.gas * self.ranks

    def lamb_grid(self) -> list[dict[str, Any]]:
        return [{"lr": lr, "warmup": w} for lr in self.lamb_lrs for w in self.warmups]

    def kfac_grid(self, *, lamb_lr: float, warmup: float) -> list[dict[str, Any]]:
        return [{"lr": lamb_lr * scale, "lr_scale": scale, "warmup": warmup, "damping": d, "factor_every": f,
                 "inv_every": i} for d in self.dampings for scale in self.kfac_lr_scales for f, i in self.intervals]

    def run_key(self) -> dict[str, Any]:
        """The fields that shape one run (model, batch, data, evaluation), not the grids or the run lengths (those
        are in the run's spec): a recorded run stays valid when only a grid changes."""
        return {k: getattr(self, k) for k in ("model_size", "seq", "max_predictions", "micro_batch", "gas",
                                              "eval_every", "eval_examples", "dupe_factor", "ranks")}

    def check_budget(self) -> None:
        """Equal tuning budgets: the same number of runs (of the same length) for both optimizers."""
        lamb = len(self.lamb_lrs) * len(self.warmups)
        kfac = len(self.dampings) * len(self.kfac_lr_scales) * len(self.intervals)
        if lamb != kfac:
            raise ValueError(f"regime {self.name}: LAMB's grid has {lamb} runs but K-FAC's has {kfac}; the tuning "
                             "budgets (runs × steps) must be equal")


REGIMES = {
    "small": Regime(
        name="small", model_size="tiny", seq=64, max_predictions=10, micro_batch=16, gas=1, steps=1500,
        tune_steps=1500, eval_every=50, eval_examples=256, lamb_lrs=(5e-3, 1e-2, 2e-2, 3e-2), warmups=(0.02, 0.1),
        dampings=(1e-4, 1e-6), kfac_lr_scales=(1.0, 1.5), intervals=((1, 10), (5, 50)),
        notes="BERT-tiny (hidden 128, 2 layers), 32 sequences of 64 tokens per step"),
    "large": Regime(
        name="large", model_size="tiny", seq=32, max_predictions=5, micro_batch=32, gas=4, steps=450, tune_steps=450,
        eval_every=15, eval_examples=256, lamb_lrs=(1e-2, 2e-2, 3e-2, 5e-2), warmups=(0.05, 0.2),
        dampings=(1e-4, 1e-6), kfac_lr_scales=(1.0, 1.5), intervals=((1, 10), (2, 20)),
        final_kfac=(("factor_sample_fraction", 0.0625),),
        texts=("wikitext-2/valid.txt", "squad/dev-v1.1-articles-00-39.json"),
        notes="BERT-tiny, 256 sequences of 32 tokens per step (32 per rank × 4 accumulated × 2 ranks)"),
}
# Large: the final runs' statistics use 1/16 of the tokens (tuned with 1/4): benchmarks.accuracy at this regime's
# batch and damping puts the capture at 0.10 of full statistics' time against 0.28, for a preconditioned-gradient
# error of 22% against 12% (cosine 0.97 against 0.99); pass subsets of the window cost more accuracy for the same
# time (docs/studies/accuracy.md).
# 450 steps, not 300: at 300 one LAMB seed left the unigram plateau only at step 265 (records in
# results/convergence/large/superseded_wikitext_300steps at commit aec5cce). On WikiText-2 valid alone, 450 steps
# overfit its 150k-word training part (its probe_450steps: training MLM 3.5 against a held-out 5.8 that rises after
# step ~285), so this regime pools it with the SQuAD dev articles' contexts (~310k training words).
# Dampings: BERT's MLM loss is a mean over the masked tokens, so G's eigenvalues are tiny (≤ ~1e-4 in the kfac
# diagnostics of these runs, A's ≤ ~80): a damping of 1e-3 or 1e-2 outweighs every λ_G·λ_A and turns K-FAC into a
# scaled identity, which is what the first grid (1e-3, 1e-2) did (its K-FAC curves lay on LAMB's;
# git show aec5cce:benchmarks/README.md).
# BERT-tiny, not BERT-mini: on 2 CPU cores a BERT-mini LAMB step of 32 × 64 tokens takes ~1.1 s, and 600 such steps
# did not take LAMB off the unigram plateau (git show aec5cce:benchmarks/README.md), so 3 seeds × 2 optimizers × 2
# regimes of runs long enough for that cannot fit the final comparison's 2 hours. `--model-size mini` runs the same
# protocol on it: in the large regime a BERT-mini run takes ~16.5 min and LAMB leaves the plateau
# (results/convergence/mini).


QUICK_UNITS = 12  # --quick splits only the pooled sources' first units


def quick(regime: Regime) -> Regime:
    """The same protocol at toy scale (tiny model, a few steps, 1 × 1 grids) for the smoke tests."""
    return dataclasses.replace(regime, model_size="tiny", seq=32, max_predictions=5, micro_batch=4,
                               gas=min(regime.gas, 2), steps=4, tune_steps=4, eval_every=2, eval_examples=16,
                               lamb_lrs=regime.lamb_lrs[:1], warmups=regime.warmups[:1], dampings=regime.dampings[:1],
                               kfac_lr_scales=regime.kfac_lr_scales[:1], intervals=((1, 2),), dupe_factor=1,
                               notes="quick: " + regime.notes)


LIBRARY_DEFAULTS = "kfac-defaults"  # a RunSpec optimizer: K-FAC as ``"kfac": {"enabled": true}`` gives it


# LAMB's schedule shape and regularisation, tuned apart from lr and warmup (issue 23, 2b): where each key lives in
# the DeepSpeed config. The shipped phase-1 config's values are the ones every run used before they were tuned.
LAMB_SHAPE_KEYS = {"degree": "lr_schedule", "weight_decay": "optimizer.params", "use_nvlamb": "optimizer.params",
                   "max_grad_norm": "optimizer.params", "eps": "optimizer.params"}


def shipped_lamb_shape() -> dict[str, Any]:
    """The shipped phase-1 config's PolyWarmUp degree, LAMB weight decay, NVLAMB flag (trust ratio on every
    parameter), global-norm threshold (``max_grad_norm``) and Adam epsilon (absent from the config: Apex's
    defaults)."""
    cfg = json.loads(LAMB_CONFIG.read_text())
    params = cfg["optimizer"]["params"]
    return {"degree": cfg["lr_schedule"]["degree"], "weight_decay": params["weight_decay"],
            "use_nvlamb": params.get("use_nvlamb", False),
            "max_grad_norm": params.get("max_grad_norm", APEX_MAX_GRAD_NORM), "eps": params.get("eps", APEX_EPS)}


def ds_config(regime: Regime, *, lr: float, warmup: float, steps: int, kfac: dict[str, Any] | None,
              library_defaults: bool = False, lamb_shape: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's DeepSpeed config: the repo's phase-1 config with this regime's batch, lr, warmup and (for K-FAC)
    the ``kfac`` section of ds_configs/bert_tiny_phase1_kfac.json with ``kfac``'s keys replaced; with
    ``library_defaults`` the section is ``{"enabled": true}`` and ``kfac``'s keys alone (what a user who turns
    K-FAC on gets: every other option at the library's default). ``lamb_shape``: PolyWarmUp ``degree`` and
    LAMB ``weight_decay`` in place of the shipped config's (:data:`LAMB_SHAPE_KEYS`)."""
    cfg = json.loads((KFAC_CONFIG if kfac is not None else LAMB_CONFIG).read_text())
    for key, value in (lamb_shape or {}).items():
        if key not in LAMB_SHAPE_KEYS:
            raise ValueError(f"lamb_shape key {key!r}: expected one of {sorted(LAMB_SHAPE_KEYS)}")
        section = cfg
        for part in LAMB_SHAPE_KEYS[key].split("."):
            section = section[part]
        section[key] = value
    if library_defaults:
        cfg["kfac"] = {"enabled": True}
    cfg["train_batch_size"] = regime.global_batch
    cfg["train_micro_batch_size_per_gpu"] = regime.micro_batch
    cfg["gradient_accumulation_steps"] = regime.gas
    cfg["optimizer"]["params"]["lr"] = lr
    cfg["lr_schedule"].update(warmup_proportion=warmup, total_steps=steps)
    if kfac is not None:
        cfg["kfac"].update(kfac)
    return dict(cfg)
