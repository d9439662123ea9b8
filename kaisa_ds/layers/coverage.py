"""What share of a model K-FAC preconditions, module type by module type, and why the rest is not.

Every module that holds trainable parameters of its own gets one verdict; a parameter shared by several modules
(a tied embedding and LM head) is counted once, at its first module. The figures a user needs: the share of all
trainable parameters preconditioned, and the share of the *linear-like* ones (modules with a matrix of weights that
is not an embedding table: Linear, Conv1D, Conv2d, and unsupported ones such as fused MoE experts), tied weights left
out of both sides because no single module's factors describe their gradient.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from torch import nn

logger = logging.getLogger(__name__)
WARN_SHARE = 0.05  # an unsupported module type holding more than this share of the trainable parameters is named


class Verdict(str, Enum):
    """What K-FAC does with a module's parameters."""

    PRECONDITIONED = "preconditioned"
    TIED = "tied weight"  # shared with another module: its gradient sums both modules' contributions
    SKIPPED = "skip_layers"
    UNSUPPORTED = "unsupported type"
    NOT_CALLED = "never called"  # its forward hook never fired: the weight is used without calling the module
    VECTORS = "1-D parameters"  # norm scales and lone biases: K-FAC has no factors for them; the optimizer steps them


class Kind(str, Enum):
    """What a module's own parameters are."""

    LINEAR = "linear-like"  # a matrix (or higher) of weights that is not an embedding table
    EMBEDDING = "embedding"
    VECTOR = "vector"  # only 1-D parameters


@dataclass(frozen=True)
class ModuleCoverage:
    name: str
    type_name: str
    kind: Kind
    params: int  # trainable parameters first held here
    verdict: Verdict
    detail: str = ""  # why (unsupported, skipped), or how (diagonal factors, several calls per pass)


def kind_of(module: nn.Module) -> Kind:
    if isinstance(module, nn.Embedding):
        return Kind.EMBEDDING
    return Kind.LINEAR if any(p.dim() >= 2 for p in module.parameters(recurse=False)) else Kind.VECTOR


def own_trainable(modules: Iterable[tuple[str, nn.Module]]) -> dict[str, int]:
    """Trainable parameters each module holds itself, a shared parameter counted at its first module."""
    seen: set[int] = set()
    out: dict[str, int] = {}
    for name, module in modules:
        count = 0
        for p in module.parameters(recurse=False):
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                count += p.numel()
        out[name] = count
    return out


@dataclass
class Coverage:
    """The verdict of every module with trainable parameters, and the shares they add up to."""

    modules: list[ModuleCoverage] = field(default_factory=list)

    def _params(self, *, verdicts: set[Verdict] | None = None, kinds: set[Kind] | None = None) -> int:
        return sum(m.params for m in self.modules
                   if (verdicts is None or m.verdict in verdicts) and (kinds is None or m.kind in kinds))

    @property
    def trainable(self) -> int:
        return self._params()

    @property
    def preconditioned(self) -> int:
        return self._params(verdicts={Verdict.PRECONDITIONED})

    @property
    def share(self) -> float:
        """Preconditioned share of all trainable parameters."""
        return self.preconditioned / self.trainable if self.trainable else 0.0

    @property
    def linear_share(self) -> float:
        """Preconditioned share of the linear-like parameters that are not tied."""
        linear = {Kind.LINEAR}
        total = self._params(kinds=linear) - self._params(kinds=linear, verdicts={Verdict.TIED})
        return self._params(kinds=linear, verdicts={Verdict.PRECONDITIONED}) / total if total else 1.0

    def by_type(self) -> dict[str, dict[str, int]]:
        """Module type → verdict → parameters."""
        out: dict[str, dict[str, int]] = {}
        for m in self.modules:
            row = out.setdefault(m.type_name, {})
            row[m.verdict.value] = row.get(m.verdict.value, 0) + m.params
        return out

    def heavy_unsupported(self, share: float = WARN_SHARE) -> dict[str, int]:
        """Module types left out as unsupported or never called (``"Type (reason)"``) holding more than ``share`` of
        the trainable parameters."""
        totals: dict[str, int] = {}
        for m in self.modules:
            if m.verdict in (Verdict.UNSUPPORTED, Verdict.NOT_CALLED):
                key = f"{m.type_name} ({m.verdict.value})"
                totals[key] = totals.get(key, 0) + m.params
        return {t: n for t, n in totals.items() if self.trainable and n > share * self.trainable}

    def not_called(self, names: set[str]) -> Coverage:
        """This coverage with the layers ``names`` (whose hooks never fired) no longer preconditioned."""
        return Coverage([replace(m, verdict=Verdict.NOT_CALLED, detail="its forward hook never fired: the weight "
                                 "is used without calling the module") if m.name in names else m
                         for m in self.modules])

    def called(self, calls: dict[str, int]) -> Coverage:
        """This coverage noting the layers called several times per forward pass (``calls``: layer -> calls)."""
        def note(m: ModuleCoverage) -> ModuleCoverage:
            if m.name not in calls or m.verdict is not Verdict.PRECONDITIONED:
                return m
            extra = "called several times per pass: each call's rows are samples"
            return replace(m, detail=f"{m.detail}; {extra}" if m.detail else extra)
        return Coverage([note(m) for m in self.modules])

    def summary(self) -> dict[str, Any]:
        """Plain numbers for metrics.jsonl, the diagnostics and the report."""
        by_reason: dict[str, int] = {}
        for m in self.modules:
            by_reason[m.verdict.value] = by_reason.get(m.verdict.value, 0) + m.params
        details = sorted({f"{m.type_name}: {m.detail}" for m in self.modules
                          if m.detail and m.verdict is not Verdict.TIED})
        return {"trainable": self.trainable, "preconditioned": self.preconditioned, "share": round(self.share, 4),
                "linear_share": round(self.linear_share, 4), "by_reason": by_reason, "by_type": self.by_type(),
                "heavy_unsupported": self.heavy_unsupported(), "notes": details}

    def lines(self) -> list[str]:
        """A small table for the log: one row per (type, verdict)."""
        rows = [f"K-FAC preconditions {self.preconditioned:,} of {self.trainable:,} trainable parameters "
                f"({self.share:.1%}; {self.linear_share:.1%} of the untied linear-like ones)"]
        for type_name, verdicts in sorted(self.by_type().items(), key=lambda kv: -sum(kv[1].values())):
            for verdict, params in verdicts.items():
                if params:
                    rows.append(f"  {type_name:<32} {verdict:<16} {params:>14,} ({params / self.trainable:.1%})")
        rows += [f"  note: {d}" for d in self.summary()["notes"]]
        return rows


def settle(coverage: Coverage, *, never: set[str], calls: dict[str, int], log: bool) -> Coverage:
    """The coverage once the first window has shown which layers are called (``never``: not at all; ``calls``:
    several times per pass), logged and warned about (:func:`report`) when ``log``."""
    settled = coverage.not_called(never).called(calls)
    if log and never:
        logger.warning("K-FAC: skipping %s: the forward hook never fired (the module is not called, its weight is "
                       "used directly, e.g. nn.MultiheadAttention.out_proj)", ", ".join(sorted(never)))
    if log:
        report(settled)
    return settled


def report(coverage: Coverage) -> None:
    """Log the coverage (info) and warn about what a user would not expect: an unsupported module type holding more
    than :data:`WARN_SHARE` of the parameters, or most linear-like parameters left out."""
    for line in coverage.lines():
        logger.info(line)
    heavy = coverage.heavy_unsupported()
    if heavy:
        named = ", ".join(f"{t} ({n / coverage.trainable:.0%} of the trainable parameters)"
                          for t, n in sorted(heavy.items(), key=lambda kv: -kv[1]))
        logger.warning("K-FAC does not precondition %s: %.0f%% of the model's trainable parameters are "
                       "preconditioned, the rest are stepped by the optimizer alone (kaisa_ds preconditions "
                       "nn.Linear, nn.Conv2d, nn.Embedding and transformers' Conv1D when the model calls them)",
                       named, 100 * coverage.share)
    elif coverage.linear_share < 0.5:
        logger.warning("K-FAC preconditions only %.0f%% of the model's untied linear-like parameters (see the "
                       "coverage table logged at info level: skip_layers, unsupported or uncalled modules)",
                       100 * coverage.linear_share)
