"""benchmarks.convergence.adam_state: which tensors' Adam steps LAMB's epsilon switched to momentum SGD."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from benchmarks.convergence import adam_state
from kaisa_ds.optim import Lamb, weight_decay_groups


class TiedLM(nn.Module):
    """An embedding tied to its output layer, a dense layer and a LayerNorm: BERT's naming and tying in miniature."""

    def __init__(self) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(10, 4)
        self.dense = nn.Linear(4, 4)
        self.LayerNorm = nn.LayerNorm(4)
        self.decoder = nn.Linear(4, 10)
        self.decoder.weight = self.embeddings.weight


def trained_checkpoint(*, small: str, steps: int = 3) -> dict[str, object]:
    """A real Lamb on the real weight-decay groups after ``steps`` steps in which parameter ``small`` had gradients
    1e-9 (far below eps 1e-6) and every other one gradients of 1."""
    torch.manual_seed(0)
    model = TiedLM()
    opt = Lamb(weight_decay_groups(model, weight_decay=0.01), lr=0.01, max_grad_norm=0.0)
    for _ in range(steps):
        for name, p in model.named_parameters():
            p.grad = torch.full_like(p, 1e-9 if name == small else 1.0)
        opt.step()
    return {"module": model.state_dict(), "optimizer": opt.state_dict()}


def test_the_tensor_fed_gradients_below_eps_is_the_one_reported_below_it_with_the_names_in_lambs_order() -> None:
    rows = {r.name: r for r in adam_state.adam_regimes(trained_checkpoint(small="decoder.bias"))}
    # the tied decoder weight is the embedding: reported once, under the embedding's name
    assert sorted(rows) == ["LayerNorm.bias", "LayerNorm.weight", "decoder.bias", "dense.bias", "dense.weight",
                            "embeddings.weight"]
    assert rows["decoder.bias"].below_eps == 1.0 and rows["decoder.bias"].median_sqrt_v == pytest.approx(1e-9, rel=1e-3)
    assert all(r.below_eps == 0.0 and r.median_sqrt_v == pytest.approx(1.0) for n, r in rows.items()
               if n != "decoder.bias")
    assert rows["embeddings.weight"].shape == (10, 4)
    assert all(r.never_updated == 0.0 for r in rows.values())


def test_elements_no_gradient_reached_are_counted_apart() -> None:
    """Rows of an embedding no token used keep v = 0: below eps, but reported as never updated."""
    ckpt = trained_checkpoint(small="decoder.bias")
    state = ckpt["optimizer"]["state"]  # type: ignore[index]
    state[0]["exp_avg_sq"][5:] = 0.0  # the embedding (first decayed parameter): rows 5-9 never used
    emb = {r.name: r for r in adam_state.adam_regimes(ckpt)}["embeddings.weight"]
    assert emb.never_updated == 0.5 and emb.below_eps == 0.5


def test_a_decayed_tensor_below_eps_is_found_too() -> None:
    """The weight group is read as well: the embedding (decayed) fed tiny gradients is the one below eps."""
    rows = {r.name: r for r in adam_state.adam_regimes(trained_checkpoint(small="embeddings.weight"))}
    assert [n for n, r in rows.items() if r.below_eps == 1.0] == ["embeddings.weight"]


def test_a_checkpoint_whose_groups_do_not_match_its_module_is_refused() -> None:
    ckpt = trained_checkpoint(small="decoder.bias")
    ckpt["optimizer"]["param_groups"][1]["params"].pop()  # type: ignore[index]
    with pytest.raises(ValueError, match="not a BERT LAMB checkpoint"):
        adam_state.adam_regimes(ckpt)


def test_the_command_reads_the_newest_step_of_a_run_folder_and_writes_json(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run" / "checkpoints"
    for step, small in ((10, "dense.weight"), (200, "decoder.bias")):
        (run / f"step{step}").mkdir(parents=True)
        torch.save(trained_checkpoint(small=small), run / f"step{step}" / adam_state.STATE_FILE)
    out = tmp_path / "regimes.json"
    adam_state.main([str(tmp_path / "run"), "--out", str(out)])
    (path, rows), = json.loads(out.read_text()).items()
    assert path.endswith(f"step200/{adam_state.STATE_FILE}")  # 200 > 10 numerically, not as text
    assert [r["name"] for r in rows if r["below_eps"] == 1.0] == ["decoder.bias"]
    assert "below eps" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"no mp_rank_00_model_states\.pt"):
        adam_state.main([str(tmp_path / "empty")])
