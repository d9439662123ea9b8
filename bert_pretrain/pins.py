"""What a checkpoint was trained on (vocabulary and data digests), so a resume on other data is refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from bert_pretrain.data.documents import DataError


def data_pins(phase_folder: Path) -> dict[str, Any]:
    """Digests of the prepared data in ``phase_folder``: its vocabulary, its input files, all its settings."""
    manifest = json.loads((phase_folder / "manifest.json").read_text())
    whole = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
    return {"vocab_digest": manifest["vocab_digest"], "inputs": manifest["inputs"], "data_digest": whole}


def check_pins(pinned: dict[str, Any], current: dict[str, Any], *, checkpoint: Path) -> None:
    """Refuse a resume whose data differs from what ``checkpoint`` was trained on, naming what changed."""
    if pinned.get("vocab_digest") != current["vocab_digest"]:
        raise DataError(f"--resume: the vocabulary differs from the one {checkpoint} was trained with (digest "
                        f"{pinned.get('vocab_digest')} vs {current['vocab_digest']}): token ids would be scrambled. "
                        f"Use --vocab {checkpoint}/vocab.txt, or start a new run without --resume")
    if pinned.get("inputs") != current["inputs"]:
        raise DataError(f"--resume: the --data files changed since {checkpoint} was written (was "
                        f"{pinned.get('inputs')}, now {current['inputs']}); restore them, or start a new run "
                        "without --resume")
    if pinned.get("data_digest") != current["data_digest"]:
        raise DataError(f"--resume: the data settings (--dupe-factor, --seed, --max-seq-length, --max-predictions, "
                        f"--doc-split, --cased, --encoding) differ from those of {checkpoint}; resume with the "
                        "original flags, or start a new run without --resume")
