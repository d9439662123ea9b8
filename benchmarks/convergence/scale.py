"""What a tuning choice was made at (scale, model, batch, length, texts, vocabulary), and the check that a final run
is made at the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.convergence.parts import Parts
from benchmarks.convergence.regimes import Regime
from benchmarks.convergence.runner import sha256_of


def scale_of(regime: Regime, *, quick_scale: bool, parts: Parts | None = None,
             vocab: Path | None = None) -> dict[str, Any]:
    """What a choice was tuned at (scale, model, batch, tuning length, sources, vocabulary): recorded in
    chosen.json and checked by ``final``."""
    return {"scale": "quick" if quick_scale else "full", "steps_per_run": regime.tune_steps, **regime.run_key(),
            **({"sources_sha256": parts.source_sha256} if parts else {}),
            **({"vocab_sha256": sha256_of(vocab)} if vocab else {})}


def check_scale(chosen: dict[str, Any], regime: Regime, *, path: Path, quick_scale: bool = False,
                parts: Parts | None = None, vocab: Path | None = None) -> None:
    """Refuse a choice tuned at another scale than the final runs': a toy-scale (``--quick``) choice, or another
    model, batch, tuning length, text or vocabulary. A chosen.json written before the scale was recorded is
    judged by its budget's steps per run."""
    tuned = chosen.get("tuned_at") or {"steps_per_run": chosen.get("budget", {}).get("lamb", {}).get("steps_per_run")}
    wanted = scale_of(regime, quick_scale=quick_scale, parts=parts, vocab=vocab)
    differ = {k: (v, wanted[k]) for k, v in tuned.items() if k in wanted and v != wanted[k]}
    if differ:
        what = ", ".join(f"{k} {a} (final: {b})" for k, (a, b) in differ.items())
        if "steps_per_run" in differ:
            what += f"; tuned with {tuned['steps_per_run']} steps per run"
        raise SystemExit(f"{path} was tuned at another scale than this final run: {what}. Tune at this scale "
                         f"first (`python -m benchmarks.convergence tune --regime {regime.name}"
                         f"{' --quick' if quick_scale else ''}`); a --quick choice is never used at full scale")
