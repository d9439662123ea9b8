"""The command line does what its help says: the recipe a model gets without --config, the documented paths,
the tokenizer checks before training, and options that would be ignored are refused, not dropped."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from squad_finetune.cli import EPILOG, build_parser, main
from tests.support.squad_data import (
    BERT_VOCAB,
    REPO_ROOT,
    numbered_words,
    requires_bert_vocab,
    save_tiny_qa_model,
    small_squad,
    word_tokenizer,
    write_json,
)


def _run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """(exit status, stderr) of the command line run in this process (refusals come before any process group)."""
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's error()
        rc = int(exc.code or 0)
    return rc, " ".join(capsys.readouterr().err.split())


def _help() -> str:
    return " ".join(build_parser().format_help().split())


def _metrics(output: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


@requires_bert_vocab
@pytest.mark.slow  # ~18 s: builds a BERT-base
def test_bert_base_sized_model_gets_the_recipe_the_help_states(tmp_path: Path) -> None:
    """Without --config a BERT-base-wide model is fine-tuned with BERT's SQuAD recipe (the old default config
    gave any model the tiny CPU recipe: lr 2e-3 and 128-token windows)."""
    from bert_pretrain.data.tokenizer import load_tokenizer

    # BERT-base's width (768) with one layer: what decides the recipe is the width, the rest keeps the test short
    model = save_tiny_qa_model(tmp_path / "base", load_tokenizer(BERT_VOCAB), hidden=768, layers=1, heads=12,
                               max_positions=512)
    squad = write_json(tmp_path / "s.json", small_squad())
    output = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "squad_finetune", "--model", str(model), "--train-file", str(squad), "--eval-file",
         str(squad), "--max-steps", "2", "--log-every", "1", "--output", str(output)],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"},
    )
    metrics = _metrics(output)
    config = metrics[0]
    assert config["event"] == "config"
    lr, window = config["recipe"]["lr"], config["recipe"]["max_seq_length"]
    assert (lr, window) == (3e-5, 384)  # BERT's SQuAD v1.1 recipe (Devlin et al. 2018)
    help_text = _help()
    assert f"{lr:g} for BERT-base-sized" in help_text and f"{window} for BERT-base-sized" in help_text
    train = [m for m in metrics if m["event"] == "train"]
    assert 0 < train[0]["lr"] <= lr  # the optimizer ran with it (linear decay after step 1 of 2)
    # the same file for training and scoring is said, in the log and in the results
    results = json.loads((output / "eval_results.json").read_text())
    assert results["eval_questions_in_train"] == 5 and "memorisation" in proc.stderr
    assert results["config"] == config["config"] and results["config"].endswith("squad_bert_base.json")


def test_documented_model_path_is_where_bert_pretrain_writes_its_model() -> None:
    """The help's first example fine-tunes bert_pretrain's phase-2 model: <phase-2 --output>/final."""
    from bert_pretrain.cli import EXAMPLES
    from bert_pretrain.cli import build_parser as pretrain_parser

    examples = " ".join(EXAMPLES.split())
    phase2 = re.search(r"--phase 2 .*?--output (\S+)", examples)
    phase1 = re.search(r"--phase 1 .*?--output (\S+)", examples)
    init = re.search(r"--init-checkpoint (\S+)", examples)
    model = re.search(r"--module squad_finetune --model (\S+)", EPILOG)
    assert phase1 and phase2 and init and model
    # bert_pretrain's own layout: its --output help names final/, and phase 2 starts from phase 1's <output>/final
    assert "final/" in " ".join(pretrain_parser().format_help().split())
    assert Path(init.group(1)) == Path(phase1.group(1)) / "final"
    assert Path(model.group(1)) == Path(phase2.group(1)) / "final"


# --- the tokenizer must read the data: the same checks as bert_pretrain, before any training --------------------

def _model_with(tmp_path: Path, tokenizer: Any) -> Path:
    return save_tiny_qa_model(tmp_path / "model", tokenizer, hidden=32, layers=1)


def test_all_unk_tokenizer_is_refused_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 205 tokens (enough for the size check), none of them a word of the SQuAD text: every word is [UNK]
    model = _model_with(tmp_path, word_tokenizer(numbered_words(200)))
    squad = write_json(tmp_path / "train.json", small_squad())
    rc, err = _run_main(["--model", str(model), "--train-file", str(squad), "--eval-file", str(squad),
                         "--output", str(tmp_path / "run")], capsys)
    assert rc == 2
    assert str(squad) in err and "[UNK]" in err and "--max-unk-rate" in err, err
    assert not (tmp_path / "run" / "model").exists()


def test_special_tokens_only_tokenizer_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _model_with(tmp_path, word_tokenizer([]))  # 5 tokens, the vocabulary transformers 5 silently builds
    squad = write_json(tmp_path / "train.json", small_squad())
    rc, err = _run_main(["--model", str(model), "--train-file", str(squad), "--eval-file", str(squad),
                         "--output", str(tmp_path / "run")], capsys)
    assert rc == 2 and "has 5 tokens" in err and str(model) in err, err


@requires_bert_vocab
def test_cased_tokenizer_with_uncased_vocabulary_is_refused(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from bert_pretrain.data.tokenizer import load_tokenizer

    model = _model_with(tmp_path, load_tokenizer(BERT_VOCAB, lower_case=False))  # uncased vocab, capitals kept
    squad = write_json(tmp_path / "train.json", small_squad())
    rc, err = _run_main(["--model", str(model), "--train-file", str(squad), "--eval-file", str(squad),
                         "--output", str(tmp_path / "run")], capsys)
    assert rc == 2 and "uncased" in err and str(model) in err, err


# --- options that the run would not read are refused ------------------------------------------------------------

@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--model", "M", "--checkpoint", "C"], ["--checkpoint", "--eval-only"]),
        (["--eval-only", "--model", "M", "--checkpoint", "C", "--eval-file", "E"], ["--model", "--checkpoint"]),
        (["--eval-only", "--checkpoint", "C", "--eval-file", "E", "--epochs", "3"], ["--epochs", "--eval-only"]),
        (["--eval-only", "--checkpoint", "C", "--eval-file", "E", "--lr", "1e-4"], ["--lr", "--eval-only"]),
        (["--eval-only", "--checkpoint", "C", "--eval-file", "E", "--max-steps", "5"], ["--max-steps"]),
        (["--eval-only", "--checkpoint", "C", "--eval-file", "E", "--warmup-proportion", "0.2"],
         ["--warmup-proportion"]),
        (["--eval-only", "--checkpoint", "C", "--eval-file", "E", "--eval-before"], ["--eval-before"]),
        (["--eval-only", "--checkpoint", "C", "--eval-file", "E", "--train-file", "T"], ["--train-file"]),
        (["--eval-only", "--checkpoint", "C", "--eval-file", "E", "--max-train-articles", "2"],
         ["--max-train-articles"]),
        (["--model", "M", "--train-file", "T", "--eval-file", "E", "--builtin-articles", "50"],
         ["--builtin-articles", "--train-file"]),
        (["--model", "M", "--train-file", "T", "--eval-file", "E", "--builtin-seed", "3"],
         ["--builtin-seed", "--train-file"]),
        (["--eval-only", "--checkpoint", "C", "--eval-file", "E", "--builtin-articles", "50"],
         ["--builtin-articles", "--eval-file"]),
    ],
)
def test_options_the_run_would_ignore_are_refused(args: list[str], fragments: list[str], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _run_main([*args, "--output", str(tmp_path / "run")], capsys)
    assert rc == 2
    for fragment in fragments:
        assert fragment in err, err
    assert not (tmp_path / "run").exists()
