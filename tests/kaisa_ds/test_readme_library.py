"""The README's quick starts stay true: "The library in five lines" runs as written (with a model, loader and
optimizer put in), the DeepSpeed quick start's JSON and Python train through ``kaisa_ds.initialize`` as written (in
a fresh process: one rank on loopback), and the README sends readers to the page that lists every option (which
tests/test_docs.py checks against KFACConfig)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from tests.support.models import TinyMLP

README = Path(__file__).resolve().parents[2] / "README.md"


def _section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("## The library in five lines")
    return text[start:text.index("\n## ", start + 1)]


def test_the_five_lines_train() -> None:
    code = re.search(r"```python\n(.*?)```", _section(), flags=re.S)
    assert code is not None
    torch.manual_seed(0)
    model = TinyMLP()
    batches = [torch.randn(8, 6) for _ in range(4)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    scope = {"model": model, "loader": batches, "optimizer": optimizer, "lr_now": 0.1}
    exec(code.group(1), scope)  # the README's own snippet
    assert scope["precond"].steps == len(batches)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_the_readme_points_to_the_page_of_every_option() -> None:
    assert re.search(r"Every option is a keyword of \[`KFACConfig`\]\(docs/configuration\.md\)", _section())


DS_WORKER = """
import json, re, sys
from pathlib import Path

import torch

import kaisa_ds
from tests.support.models import TinyMLP

readme = Path(sys.argv[1]).read_text(encoding="utf-8")
section = readme[readme.index("## Turn K-FAC on under DeepSpeed"):readme.index("## Install")]
kfac_json = re.search(r"```json\\n(.*?)```", section, flags=re.S).group(1)
code = re.search(r"```python\\n(.*?)```", section, flags=re.S).group(1)
config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 100,
          "optimizer": {"type": "Lamb", "params": {"lr": 0.005}}, **json.loads("{" + kfac_json + "}")}
Path("ds_config.json").write_text(json.dumps(config))


class Model(TinyMLP):
    def forward(self, batch):
        return super().forward(batch).pow(2).mean()


kaisa_ds.init_distributed()
torch.manual_seed(0)
model = Model()
dataset = [torch.randn(6) for _ in range(12)]
before = [p.detach().clone() for p in model.parameters()]
scope = {"model": model, "dataset": dataset}
exec(code, scope)  # the README's own snippet
engine = scope["engine"]
changed = all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
print("KFAC_STEPS", engine.kfac.steps, "CHANGED", changed)
"""


def test_the_deepspeed_quick_start_trains_as_written(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    repo = README.parent
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env |= {"PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", DS_WORKER, str(README)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "KFAC_STEPS 3 CHANGED True" in proc.stdout, proc.stdout[-2000:]
