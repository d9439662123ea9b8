"""kaisa_ds against kfac-pytorch (gpauloski/kfac-pytorch, the KAISA reference implementation), side by side.

Three identical copies of one HF BertForPreTraining (same weights, same batch): a baseline without K-FAC, one with
kaisa_ds's KFACPreconditioner and one with kfac-pytorch's, both with the same settings: factors every
``--factor-every`` steps, decompositions every ``--inv-every``, eigen method, damping 0.001, factor_decay 0.95,
kl_clip 0.001, the same skip_layers (KAISA's BERT recipe: the 24 encoder Linear layers of BERT-mini), fp32, one
process. As in step_cost.py, each kind of step of a decomposition interval (decomposition, factor, plain) is
measured for real by setting each library's step counter, and the interval average is exact. K-FAC time of a kind
= forward+backward with the library's hooks - the baseline's forward+backward (the hooks' extra cost) + the wall
time of ``precond.step()``. The two libraries alternate within every round and the one that goes first flips each
round, so other work on the machine falls on both; medians of ``--repeats`` rounds after ``--warmup``. Headline:
the amortised K-FAC time per step of each and the ratio kfac-pytorch / kaisa_ds (issue 9's target: >= 2).

Stages: kaisa_ds's from ``precond.timings``; kfac-pytorch's by timing its layer methods (statistics and running
average in the hooks, eigendecompositions, preconditioning, KL clip, gradient write-back) without changing them.

Also: K-FAC memory after a decomposition step (kaisa_ds: ``memory_usage()``; kfac-pytorch: every tensor its layer
objects hold), each library's peak-RSS rise in its own fresh process, and whether the two compute the same
preconditioned gradients after one factor+decomposition step on the same batch; where they differ, the two
conventions behind it (kfac-pytorch starts a factor's running average from the identity and does not scale G by
the batch size) are measured, then kfac-pytorch is given kaisa_ds's factors to show that the rest agrees.

kfac-pytorch is not a dependency of this project; see the message printed when it is missing (INSTALL below).

    PYTHONPATH=$PWD:/tmp/kfp-site python -m benchmarks.versus_kfac_pytorch          # BERT-mini, batch 32 x 128
    PYTHONPATH=$PWD:/tmp/kfp-site python -m benchmarks.versus_kfac_pytorch --batch 8 --repeats 3 --threads 1
"""

from __future__ import annotations

import argparse
import copy
import logging
import math
import os
import time
import warnings
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Any, Protocol

import torch
from tqdm import tqdm

from benchmarks.common import (
    BERT_SIZES,
    KAISA_SKIP,
    bert_for_pretraining,
    isolated,
    machine,
    machine_line,
    median,
    parser,
    pretraining_loss,
    publish,
    random_batch,
    table,
    timed,
)
from benchmarks.step_cost import Interval

# the settings both libraries get (issue 9: "the same model, batch and intervals")
DAMPING = 0.001
FACTOR_DECAY = 0.95
KL_CLIP = 0.001
LIBRARIES = ("kaisa_ds", "kfac-pytorch")
# stages of precond.step(); factor_capture runs in the hooks, inside forward+backward
STEP_STAGES = ("decomposition", "preconditioning", "kl_clip", "write_grads")
COMPONENTS = ("factor_capture", "hook_machinery", *STEP_STAGES, "step_other")
MB = 2**20

INSTALL = """\
kfac-pytorch (module `kfac`) is not importable. It is not a dependency of this project and is never installed
by it; install it into a scratch directory outside the repository, leaving this environment's packages alone:
  1. get its source, e.g.  git clone https://github.com/gpauloski/kfac-pytorch /tmp/kfac-pytorch-src
     (or export a fetched mirror: git --git-dir=<mirror> archive HEAD | tar -x -C /tmp/kfac-pytorch-src)
  2. python -m pip install --no-deps --target /tmp/kfp-site /tmp/kfac-pytorch-src
     (its only dependency is torch, already here; --no-deps keeps pip from touching anything else)
  3. run with it on the path:
     PYTHONPATH=$PWD:/tmp/kfp-site python -m benchmarks.versus_kfac_pytorch ..."""


def import_kfac() -> ModuleType:
    """kfac-pytorch's preconditioner module, or SystemExit with the install steps (it is never installed here)."""
    try:
        with warnings.catch_warnings():  # "NVIDIA Apex is not installed": irrelevant on one process
            warnings.simplefilter("ignore")
            import kfac.preconditioner as kfp
    except ImportError as exc:
        raise SystemExit(f"{INSTALL}\n(import error: {exc})") from None
    return kfp


def kfac_version() -> str | None:
    """The installed kfac-pytorch distribution's version, so a result names what it was compared with."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kfac_pytorch")
    except PackageNotFoundError:
        return None


# ------------------------------------------------------------------------------------------------ libraries
def fwd_bwd(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> None:
    """One training forward+backward (fresh gradients, so both libraries precondition the same ones)."""
    model.zero_grad(set_to_none=True)
    pretraining_loss(model, batch).backward()


class Runner(Protocol):
    """One library's K-FAC on its own copy of the model, behind the few calls the benchmark needs."""

    name: str
    model: torch.nn.Module

    def set_step(self, step: int) -> None: ...

    def step(self) -> None: ...

    def stages(self) -> dict[str, float]: ...

    def layer_names(self) -> list[str]: ...

    def memory(self) -> dict[str, int]: ...


class KaisaRunner:
    """kaisa_ds's KFACPreconditioner; its own stage timer gives the stages."""

    name = "kaisa_ds"

    def __init__(self, model: torch.nn.Module, *, factor_every: int, inv_every: int, lr: float, cuda: bool,
                 inv_dtype: str = "fp32", sample_fraction: float = 1.0) -> None:
        from kaisa_ds import KFACPreconditioner

        self.model = model
        self.precond = KFACPreconditioner(
            model, factor_update_steps=factor_every, inv_update_steps=inv_every, damping=DAMPING,
            factor_decay=FACTOR_DECAY, kl_clip=KL_CLIP, lr=lr, compute_method="eigen", skip_layers=KAISA_SKIP,
            inv_dtype=inv_dtype, factor_sample_fraction=sample_fraction)
        self.precond.timer.sync = cuda

    def set_step(self, step: int) -> None:
        self.precond.steps = step  # the hooks read the step kind during forward+backward

    def step(self) -> None:
        self.precond.step()

    def stages(self) -> dict[str, float]:
        t = self.precond.timings
        return {"factor_capture": t["factor_capture"], **{s: t[s] for s in STEP_STAGES}}

    def layer_names(self) -> list[str]:
        return list(self.precond.layers)

    def memory(self) -> dict[str, int]:
        return dict(self.precond.memory_usage())


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# kfac-pytorch layer methods and the stage each one belongs to
KFP_STAGE_OF = {
    "save_layer_input": "factor_capture", "save_layer_grad_output": "factor_capture",
    "update_a_factor": "factor_capture", "update_g_factor": "factor_capture",
    "reduce_a_factor": "factor_capture", "reduce_g_factor": "factor_capture",
    "compute_a_inv": "decomposition", "compute_g_inv": "decomposition",
    "preconditioned_grad": "preconditioning", "update_grad": "write_grads",
}
KFP_FACTOR_ATTRS = ("_a_factor", "_g_factor", "_a_batch", "_g_batch")
KFP_DECOMPOSITION_ATTRS = ("_qa", "_qg", "_da", "_dg", "_dgda")


class KfpRunner:
    """kfac-pytorch's KFACPreconditioner; its layer methods are wrapped (per instance) to time its stages."""

    name = "kfac-pytorch"

    def __init__(self, model: torch.nn.Module, *, factor_every: int, inv_every: int, lr: float, cuda: bool,
                 kfp: ModuleType, inv_dtype: str = "fp32", prediv: bool = True) -> None:
        self.model = model
        self.cuda = cuda
        self.precond = kfp.KFACPreconditioner(
            model, factor_update_steps=factor_every, inv_update_steps=inv_every, damping=DAMPING,
            factor_decay=FACTOR_DECAY, kl_clip=KL_CLIP, lr=lr, accumulation_steps=1, compute_method="eigen",
            skip_layers=list(KAISA_SKIP), loglevel=logging.DEBUG, inv_dtype=DTYPES[inv_dtype],
            compute_eigenvalue_outer_product=prediv)
        self.seconds: dict[str, float] = {}
        for _, layer in self.precond._layers.values():
            for method, stage in KFP_STAGE_OF.items():
                setattr(layer, method, self._timed(getattr(layer, method), stage))
        self.precond._compute_grad_scale = self._timed(self.precond._compute_grad_scale, "kl_clip")

    def _timed(self, fn: Callable[..., Any], stage: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.cuda:
                    torch.cuda.synchronize()
                self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start

        return wrapper

    def set_step(self, step: int) -> None:
        self.precond._steps = step  # its hooks read `steps` (a property over _steps)
        self.seconds = {}

    def step(self) -> None:
        self.precond.step()

    def stages(self) -> dict[str, float]:
        return {s: self.seconds.get(s, 0.0) for s in ("factor_capture", *STEP_STAGES)}

    def layer_names(self) -> list[str]:
        return [name for name, _ in self.precond._layers.values()]

    def memory(self) -> dict[str, int]:
        """Bytes of every tensor its layer objects hold, as factors (running averages and batch buffers),
        decompositions (eigenvectors, eigenvalues, the cached 1/(dg daᵀ + damping)) or other."""
        out = {"factors": 0, "decompositions": 0, "other": 0}
        seen: set[int] = set()
        for _, layer in self.precond._layers.values():
            for attr, value in vars(layer).items():
                if not isinstance(value, torch.Tensor) or value.data_ptr() in seen:
                    continue
                seen.add(value.data_ptr())
                kind = ("factors" if attr in KFP_FACTOR_ATTRS else
                        "decompositions" if attr in KFP_DECOMPOSITION_ATTRS else "other")
                out[kind] += value.numel() * value.element_size()
        out["own_memory_usage_total"] = int(self.precond.memory_usage()["total"])  # its own count, to cross-check
        return out


def make_runner(library: str, model: torch.nn.Module, *, factor_every: int, inv_every: int, lr: float,
                cuda: bool, inv_dtype: str = "fp32", sample_fraction: float = 1.0, prediv: bool = True) -> Runner:
    """A runner of one library; ``inv_dtype`` applies to both, ``sample_fraction`` to kaisa_ds only (kfac-pytorch
    has no such option) and ``prediv`` (its cached eigenvalue denominator) to kfac-pytorch only."""
    common = {"factor_every": factor_every, "inv_every": inv_every, "lr": lr, "cuda": cuda, "inv_dtype": inv_dtype}
    if library == KaisaRunner.name:
        return KaisaRunner(model, sample_fraction=sample_fraction, **common)  # type: ignore[arg-type]
    return KfpRunner(model, kfp=import_kfac(), prediv=prediv, **common)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ timing
class SideBySide:
    """A baseline BERT and one copy per library, sharing one batch; times each kind of step for each library."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.interval = Interval(args.factor_every, args.inv_every)
        self.base = bert_for_pretraining(args.size, vocab=args.vocab, seq=args.seq).to(device)
        self.batch = random_batch(args.batch, args.seq, args.vocab, device)
        opts = {"factor_every": args.factor_every, "inv_every": args.inv_every, "lr": args.lr, "cuda": self.cuda,
                "inv_dtype": args.inv_dtype, "sample_fraction": args.sample_fraction, "prediv": not args.kfp_no_prediv}
        self.runners = [make_runner(lib, copy.deepcopy(self.base), **opts) for lib in LIBRARIES]  # type: ignore[arg-type]
        names = [sorted(r.layer_names()) for r in self.runners]
        if names[0] != names[1]:
            raise RuntimeError(f"the libraries precondition different layers: {names}")
        self.layers = len(names[0])

    def round(self, kinds: list[str], *, first: int) -> dict[str, dict[str, Any]]:
        """Every kind of step once for each library (``first`` goes first), each right after its own baseline
        forward+backward, so that the hooks' cost is a difference of two adjacent timings."""
        order = self.runners[first:] + self.runners[:first]
        out: dict[str, dict[str, Any]] = {}
        for kind in kinds:
            row: dict[str, Any] = {}
            for runner in order:
                base = timed(partial(fwd_bwd, self.base, self.batch), cuda=self.cuda)
                runner.set_step(self.interval.step_number(kind))
                fb = timed(partial(fwd_bwd, runner.model, self.batch), cuda=self.cuda)
                st = timed(runner.step, cuda=self.cuda)
                row[runner.name] = {"baseline_fwd_bwd": base, "fwd_bwd": fb, "precond_step": st, **runner.stages()}
            out[kind] = row
        return out


def summarise(rounds: list[dict[str, dict[str, Any]]], agg: Callable[[list[float]], float], *,
              paired: bool) -> dict[str, Any]:
    """Aggregate (median or min) every raw timing over the rounds, then derive per library and kind:
    hook_extra = forward+backward with hooks - the baseline forward+backward run just before it (``paired``: the
    aggregate of the per-round differences, robust to load that drifts over a run; else the difference of the
    aggregates, for the fastest-rounds estimate); hook_machinery = hook_extra - the statistics timed inside the
    hooks; step_other = the part of ``precond.step()`` outside the named stages."""
    kinds = list(rounds[0])
    out: dict[str, Any] = {"baseline_fwd_bwd": agg([r[k][lib]["baseline_fwd_bwd"] for r in rounds for k in kinds
                                                    for lib in LIBRARIES])}
    for lib in LIBRARIES:
        per_kind: dict[str, dict[str, float]] = {}
        for kind in kinds:
            row = {c: agg([r[kind][lib][c] for r in rounds]) for c in rounds[0][kind][lib]}
            runs = [r[kind][lib] for r in rounds]
            row["hook_extra"] = (agg([x["fwd_bwd"] - x["baseline_fwd_bwd"] for x in runs]) if paired
                                 else row["fwd_bwd"] - row["baseline_fwd_bwd"])
            row["hook_machinery"] = row["hook_extra"] - row["factor_capture"]
            row["step_other"] = row["precond_step"] - sum(row[s] for s in STEP_STAGES)
            row["kfac_total"] = row["hook_extra"] + row["precond_step"]
            per_kind[kind] = row
        out[lib] = per_kind
    return out


def amortise(kinds: dict[str, dict[str, float]], interval: Interval) -> dict[str, Any]:
    """Interval average of the K-FAC time and of each component: each kind weighted by its count per interval."""
    counts = interval.counts()
    per_step = {c: sum(n * kinds[k][c] for k, n in counts.items()) / interval.inv_every for c in COMPONENTS}
    total = sum(n * kinds[k]["kfac_total"] for k, n in counts.items()) / interval.inv_every
    return {"counts": counts, "seconds_per_step": total, "components_seconds_per_step": per_step}


def speedup(*, kfp_seconds: float, kaisa_seconds: float) -> float:
    """kfac-pytorch's time over kaisa_ds's (> 1: kaisa_ds is faster); NaN when a time is not positive (noise)."""
    if kfp_seconds <= 0 or kaisa_seconds <= 0:
        return math.nan
    return kfp_seconds / kaisa_seconds


def compare(summary: dict[str, Any], interval: Interval) -> dict[str, Any]:
    """Both libraries' amortised K-FAC time, their overhead over a baseline forward+backward, and the ratio."""
    am = {lib: amortise(summary[lib], interval) for lib in LIBRARIES}
    base = summary["baseline_fwd_bwd"]
    return {"amortised": am,
            "overhead_of_fwd_bwd": {lib: am[lib]["seconds_per_step"] / base for lib in LIBRARIES},
            "ratio_kfp_over_kaisa": speedup(kfp_seconds=am["kfac-pytorch"]["seconds_per_step"],
                                            kaisa_seconds=am["kaisa_ds"]["seconds_per_step"]),
            "ratio_per_kind": {k: speedup(kfp_seconds=summary["kfac-pytorch"][k]["kfac_total"],
                                          kaisa_seconds=summary["kaisa_ds"][k]["kfac_total"])
                               for k in interval.counts()}}


# ------------------------------------------------------------------------------------------------ agreement
def grad_matrices(model: torch.nn.Module, names: list[str]) -> dict[str, torch.Tensor]:
    """``[∇W | ∇b]`` of each named Linear layer (FP32 copies)."""
    modules = dict(model.named_modules())
    out = {}
    for n in names:
        m = modules[n]
        out[n] = torch.cat([m.weight.grad.float(), m.bias.grad.float().reshape(-1, 1)], dim=1).clone()
    return out


def rel_diff(x: torch.Tensor, *, ref: torch.Tensor) -> float:
    """max |x - ref| / max |ref|: relative to the matrix's largest entry, so entries near zero do not dominate."""
    return float((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def cosine(x: torch.Tensor, y: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(x.reshape(1, -1).double(), y.reshape(1, -1).double()))


def agreement(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """One factor+decomposition step (step 0) of each library on the same batch: their preconditioned gradients,
    the conventions that separate them (measured per factor), and the gradients once kfac-pytorch is given
    kaisa_ds's factors. Also each library's K-FAC memory after that decomposition step."""
    base = bert_for_pretraining(args.size, vocab=args.vocab, seq=args.seq).to(device)
    batch = random_batch(args.batch, args.seq, args.vocab, device, seed=1)
    opts = {"factor_every": args.factor_every, "inv_every": args.inv_every, "lr": args.lr,
            "cuda": device.type == "cuda"}
    kaisa = KaisaRunner(copy.deepcopy(base), **opts)  # type: ignore[arg-type]
    kfp = KfpRunner(copy.deepcopy(base), kfp=import_kfac(), **opts)  # type: ignore[arg-type]
    names = kaisa.layer_names()
    kfp_modules = dict(kfp.model.named_modules())
    kfp_layers = {n: kfp.precond._layers[kfp_modules[n]][1] for n in names}
    new_stats: dict[tuple[str, str], torch.Tensor] = {}  # kfac-pytorch's statistic of this batch, per factor
    for n, layer in kfp_layers.items():
        for f in ("a", "g"):
            update = getattr(layer, f"update_{f}_factor")

            def snapshot(*a: Any, _n: str = n, _f: str = f, _layer: Any = layer, _update: Any = update,
                         **kw: Any) -> Any:
                new_stats[(_n, _f)] = getattr(_layer, f"_{_f}_batch").clone()
                return _update(*a, **kw)

            setattr(layer, f"update_{f}_factor", snapshot)
    for r in (kaisa, kfp):
        r.set_step(0)  # step 0 updates factors and decompositions in both
        torch.manual_seed(2)  # BERT's dropout: the same masks in both passes
        fwd_bwd(r.model, batch)
    raw = {r.name: grad_matrices(r.model, names) for r in (kaisa, kfp)}
    for r in (kaisa, kfp):
        r.step()
    pre = {r.name: grad_matrices(r.model, names) for r in (kaisa, kfp)}
    memory = {r.name: r.memory() for r in (kaisa, kfp)}

    # conventions, per factor: kfac-pytorch's G statistic is E[g gᵀ] of the output gradients as they are
    # (kaisa_ds: times batch², the per-sample gradients of a mean loss), and its first running average is
    # ξ·I + (1-ξ)·statistic (kaisa_ds: the statistic itself)
    xi, bsq = FACTOR_DECAY, float(args.batch) ** 2
    a_stat, g_stat, g_scale, prior = [], [], [], []
    for n in names:
        kl, pl = kaisa.precond.layers[n], kfp_layers[n]
        a_k, g_k = kl.a.value, kl.g.value
        assert a_k is not None and g_k is not None, n
        a_p, g_p = new_stats[(n, "a")], new_stats[(n, "g")]
        a_stat.append(rel_diff(a_p, ref=a_k))
        g_stat.append(rel_diff(bsq * g_p, ref=g_k))
        g_scale.append(float((g_k * g_p).sum() / (g_p * g_p).sum()))  # least squares: g_k ≈ s·g_p
        for stat, factor in ((a_p, pl.a_factor), (g_p, pl.g_factor)):
            eye = torch.eye(stat.shape[0], device=device)
            prior.append(rel_diff(factor, ref=xi * eye + (1 - xi) * stat))
        pl.a_factor, pl.g_factor = a_k.clone(), g_k.clone()  # for the aligned run below

    # aligned: kfac-pytorch with kaisa_ds's factors, from the same raw gradients, through its own
    # eigendecomposition, preconditioning, KL clip and write-back
    with torch.no_grad():
        for n in names:
            g = raw[kfp.name][n]
            kfp_modules[n].weight.grad.copy_(g[:, :-1])
            kfp_modules[n].bias.grad.copy_(g[:, -1])
    kfp.set_step(0)
    kfp.step()
    aligned = grad_matrices(kfp.model, names)

    def worst(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, Any]:
        diffs = {n: rel_diff(a[n], ref=b[n]) for n in names}
        layer = max(diffs, key=lambda n: diffs[n])
        norm = math.sqrt(sum(float(a[n].double().square().sum()) for n in names)
                         / sum(float(b[n].double().square().sum()) for n in names))
        return {"max_rel_diff": diffs[layer], "layer": layer, "min_cosine": min(cosine(a[n], b[n]) for n in names),
                "norm_ratio": norm}

    return {
        "raw_gradients": worst(raw[kfp.name], raw[kaisa.name]),
        "preconditioned": worst(pre[kfp.name], pre[kaisa.name]),
        "conventions": {
            "A_statistic_max_rel_diff": max(a_stat),
            "G_statistic_times_batch_squared_max_rel_diff": max(g_stat),
            "G_scale_measured_median": median(g_scale), "G_scale_min": min(g_scale), "G_scale_max": max(g_scale),
            "G_scale_expected_batch_squared": bsq,
            "identity_prior_max_rel_diff": max(prior),
        },
        "preconditioned_with_kaisa_factors": worst(aligned, pre[kaisa.name]),
        "memory": memory, "layers": len(names),
    }


# ------------------------------------------------------------------------------------------------ peak RSS
def _peak_rss(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: a baseline forward+backward, then one library's decomposition step and a plain step;
    how far that raised the process's peak memory, and the library's K-FAC bytes."""
    from benchmarks.memory import peak_bytes

    if cfg["threads"] is not None:
        torch.set_num_threads(cfg["threads"])
    device = torch.device(cfg["device"])
    model = bert_for_pretraining(cfg["size"], vocab=cfg["vocab"], seq=cfg["seq"]).to(device)
    batch = random_batch(cfg["batch"], cfg["seq"], cfg["vocab"], device)
    fwd_bwd(model, batch)
    base = peak_bytes(device)
    runner = make_runner(cfg["library"], model, factor_every=cfg["factor_every"], inv_every=cfg["inv_every"],
                         lr=cfg["lr"], cuda=device.type == "cuda")
    for step in (cfg["inv_every"], 1):
        runner.set_step(step)
        fwd_bwd(model, batch)
        runner.step()
    return {"library": cfg["library"], "peak_delta": peak_bytes(device) - base, **runner.memory(),
            "peak_source": "cuda.max_memory_allocated" if device.type == "cuda" else "ru_maxrss"}


# ------------------------------------------------------------------------------------------------ run
def measure(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    info = machine()
    run = SideBySide(args, device)
    kinds = list(run.interval.counts())
    for i in range(args.warmup):  # allocations, K-FAC structure, first decompositions
        run.round(kinds, first=i % 2)
    rounds = [run.round(kinds, first=i % 2) for i in tqdm(range(args.repeats), desc="rounds", leave=False)]
    if run.runners[0].precond.skipped_windows:  # type: ignore[attr-defined]
        raise RuntimeError("kaisa_ds dropped a window for non-finite values: the timings are not of real steps")
    med, best = summarise(rounds, median, paired=True), summarise(rounds, min, paired=False)
    agree = agreement(args, device)
    cfg = {k: getattr(args, k) for k in ("size", "vocab", "batch", "seq", "factor_every", "inv_every", "lr",
                                         "device", "threads")}
    rss = isolated(_peak_rss, [({**cfg, "library": lib},) for lib in LIBRARIES], parallel=1)
    return {
        "machine": info,
        "settings": {**vars(args), "out": str(args.out), "damping": DAMPING, "factor_decay": FACTOR_DECAY,
                     "kl_clip": KL_CLIP, "compute_method": "eigen", "skip_layers": list(KAISA_SKIP),
                     "kfac_layers": run.layers, "kfac_pytorch_file": import_kfac().__file__,
                     "kfac_pytorch_version": kfac_version()},
        "step_kinds": med, "comparison": compare(med, run.interval),
        # the same from each timing's fastest round: an estimate less exposed to other work on a shared machine
        "comparison_from_minima": compare(best, run.interval), "step_kinds_minima": best,
        "agreement": agree, "peak_rss": rss, "rounds": rounds, "load_average_1m_after": os.getloadavg()[0],
    }


def report(res: dict[str, Any], *, target: float = 2.0) -> str:
    """The printed tables: per step kind, amortised components, headline ratio, memory, agreement."""
    s, kinds = res["settings"], res["step_kinds"]
    cmp, best = res["comparison"], res["comparison_from_minima"]
    counts = cmp["amortised"]["kaisa_ds"]["counts"]
    lines = [f"kaisa_ds vs kfac-pytorch: BERT-{s['size']} fp32 batch {s['batch']}x{s['seq']} on {s['device']}, "
             f"inv_dtype {s.get('inv_dtype', 'fp32')} (both), kaisa_ds factor_sample_fraction "
             f"{s.get('sample_fraction', 1.0)}, "
             f"{s['kfac_layers']} K-FAC layers each; factors every {s['factor_every']}, decompositions every "
             f"{s['inv_every']} steps; medians of {s['repeats']} rounds (seconds)", machine_line(res["machine"]), ""]
    cols = [f"{lib} {k}" for k in counts for lib in LIBRARIES]
    rows = []
    for comp in ("baseline_fwd_bwd", "fwd_bwd", "hook_extra", *COMPONENTS, "precond_step", "kfac_total"):
        rows.append({"what": comp, **{f"{lib} {k}": kinds[lib][k][comp] for k in counts for lib in LIBRARIES}})
    rows.append({"what": "steps of this kind per interval", **{f"{lib} {k}": n for k, n in counts.items()
                                                               for lib in LIBRARIES}})
    lines += [table(rows, ["what", *cols]), ""]
    am = cmp["amortised"]
    per = {lib: am[lib]["components_seconds_per_step"] for lib in LIBRARIES}
    comp_rows = [{"component": c, **{lib: per[lib][c] for lib in LIBRARIES},
                  "kfac-pytorch / kaisa_ds": speedup(kfp_seconds=per["kfac-pytorch"][c],
                                                     kaisa_seconds=per["kaisa_ds"][c])}
                 for c in COMPONENTS]
    comp_rows.append({"component": "**K-FAC total, s/step**", **{lib: am[lib]["seconds_per_step"] for lib in LIBRARIES},
                      "kfac-pytorch / kaisa_ds": cmp["ratio_kfp_over_kaisa"]})
    lines += ["Amortised over the interval, s/step:", table(comp_rows, ["component", *LIBRARIES,
                                                                        "kfac-pytorch / kaisa_ds"]), ""]
    ratio = cmp["ratio_kfp_over_kaisa"]
    verdict = "met" if ratio >= target else "NOT met"
    lines.append(f"amortised K-FAC time: kaisa_ds {am['kaisa_ds']['seconds_per_step']:.4g} s/step "
                 f"({100 * cmp['overhead_of_fwd_bwd']['kaisa_ds']:.1f}% of a baseline forward+backward), kfac-pytorch "
                 f"{am['kfac-pytorch']['seconds_per_step']:.4g} s/step "
                 f"({100 * cmp['overhead_of_fwd_bwd']['kfac-pytorch']:.1f}%): **kfac-pytorch / kaisa_ds = "
                 f"{ratio:.2f}x** (target >= {target:g}: {verdict}); per kind: "
                 + ", ".join(f"{k} {v:.2f}x" for k, v in cmp["ratio_per_kind"].items()))
    lines.append(f"from each timing's fastest round: {best['ratio_kfp_over_kaisa']:.2f}x "
                 f"(kaisa_ds {best['amortised']['kaisa_ds']['seconds_per_step']:.4g}, kfac-pytorch "
                 f"{best['amortised']['kfac-pytorch']['seconds_per_step']:.4g} s/step); load average "
                 f"{res['machine']['load_average_1m']:.1f} before, {res['load_average_1m_after']:.1f} after")
    if any(v["kfac_total"] < 0 for lib in LIBRARIES for v in kinds[lib].values()) or math.isnan(ratio):
        lines.append("WARNING: a K-FAC time is negative: timing noise exceeds the effect (busy machine?); "
                     "rerun with more --repeats or --threads 1")
    agree = res["agreement"]
    mem_rows = []
    for lib in LIBRARIES:
        m = agree["memory"][lib]
        rss = next(r for r in res["peak_rss"] if r["library"] == lib)
        mem_rows.append({"library": lib, "factors MiB": m["factors"] / MB, "decompositions MiB": m["decompositions"]
                         / MB, "K-FAC MiB": (m["factors"] + m["decompositions"]) / MB,
                         "K-FAC MB (10^6)": (m["factors"] + m["decompositions"]) / 1e6,
                         "peak RSS rise MiB (own process)": rss["peak_delta"] / MB})
    lines += ["", "K-FAC memory after a decomposition step (one process):",
              table(mem_rows, ["library", "factors MiB", "decompositions MiB", "K-FAC MiB", "K-FAC MB (10^6)",
                               "peak RSS rise MiB (own process)"])]
    own = agree["memory"]["kfac-pytorch"]["own_memory_usage_total"]
    lines.append(f"(kfac-pytorch's own memory_usage() total: {own / MB:.4g} MiB; tensors of other roles: "
                 f"{agree['memory']['kfac-pytorch']['other']} bytes)")
    conv = agree["conventions"]
    lines += ["", "Same computation? One factor+decomposition step (step 0) on the same batch, "
              f"{agree['layers']} layers; max relative difference = max|x - ref| / max|ref| per layer, worst layer:",
              table([{"compared": "raw gradients (before step)", **agree["raw_gradients"]},
                     {"compared": "preconditioned gradients", **agree["preconditioned"]},
                     {"compared": "preconditioned, kfac-pytorch given kaisa_ds's factors",
                      **agree["preconditioned_with_kaisa_factors"]}],
                    ["compared", "max_rel_diff", "min_cosine", "norm_ratio", "layer"]),
              f"conventions (per factor, worst): kfac-pytorch's A statistic = kaisa_ds's to "
              f"{conv['A_statistic_max_rel_diff']:.2g}; its G statistic x batch² = kaisa_ds's to "
              f"{conv['G_statistic_times_batch_squared_max_rel_diff']:.2g} (least-squares ratio "
              f"{conv['G_scale_measured_median']:.6g}, range {conv['G_scale_min']:.6g}..{conv['G_scale_max']:.6g}; "
              f"batch² = {conv['G_scale_expected_batch_squared']:g}): kaisa_ds turns the output gradients of a "
              "mean loss back into per-sample ones, kfac-pytorch keeps them 1/batch smaller; its first running "
              f"average = {FACTOR_DECAY}·I + {1 - FACTOR_DECAY:.2g}·statistic to "
              f"{conv['identity_prior_max_rel_diff']:.2g} "
              "(kaisa_ds's first average is the statistic itself)"]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = parser("versus_kfac_pytorch", __doc__)
    p.add_argument("--size", default="mini", choices=list(BERT_SIZES), help="BERT size (default: %(default)s)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--lr", type=float, default=1e-3, help="K-FAC's lr for the KL clip, both libraries")
    p.add_argument("--factor-every", type=int, default=5, help="factor_update_steps (default: %(default)s)")
    p.add_argument("--inv-every", type=int, default=50, help="inv_update_steps (default: %(default)s)")
    p.add_argument("--inv-dtype", default="fp32", choices=list(DTYPES),
                   help="inv_dtype of both libraries: decompositions stored and applied in it (default fp32)")
    p.add_argument("--sample-fraction", type=float, default=1.0,
                   help="kaisa_ds's factor_sample_fraction (kfac-pytorch has none; default 1: exact)")
    p.add_argument("--kfp-no-prediv", action="store_true",
                   help="turn off kfac-pytorch's compute_eigenvalue_outer_product (its cached 1/(dg daᵀ + damping), "
                        "on by default there)")
    p.add_argument("--repeats", type=int, default=7, help="measured rounds; medians are reported")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own choice)")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parsed and checked arguments (errors exit with status 2 before anything is built)."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        p.error("--repeats must be >= 1 and --warmup >= 0")
    if args.batch < 1 or args.seq < 2 or args.vocab < 2:
        p.error("--batch must be >= 1, --seq >= 2 and --vocab >= 2")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    try:
        Interval(args.factor_every, args.inv_every)
    except ValueError as exc:
        p.error(str(exc))
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import_kfac()  # exits with the install steps when kfac-pytorch is missing
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    res = measure(args)
    publish(res, report(res), args.out)
    return res


if __name__ == "__main__":
    main()
