"""The wheel installs the library only; the applications run from a checkout.

``pip install kaisa_ds`` once put top-level packages named ``benchmarks``, ``mission``, ``bert_pretrain`` and
``squad_finetune`` into site-packages, where the first two collide with any user code of that name. The wheel built
from this tree must hold ``kaisa_ds`` alone (with its own optional extras as extras), and the applications must
still import as the README runs them: from the repository root, and in ranks started by the deepspeed launcher or
torchrun, with nothing but kaisa_ds installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
APPS = ("bert_pretrain", "squad_finetune", "mission", "benchmarks")
BIN = Path(sys.executable).parent


def _source_tree(into: Path) -> Path:
    """The build's inputs: pyproject.toml, the README and every top-level package folder of the checkout (the
    applications too, so the test fails if the build configuration takes them in); no records, no caches."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, into / name)
    for folder in sorted(REPO.iterdir()):
        if folder.is_dir() and (folder / "__init__.py").is_file():
            shutil.copytree(folder, into / folder.name,
                            ignore=shutil.ignore_patterns("__pycache__", "results", "*.egg-info"))
    return into


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = _source_tree(tmp_path_factory.mktemp("source"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "--disable-pip-version-check", str(source), "-w", str(out)], check=True, timeout=300)
    (built,) = out.glob("kaisa_ds-*.whl")
    return built


def test_the_wheel_installs_kaisa_ds_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"kaisa_ds"}, sorted(top)
    assert "kaisa_ds/__init__.py" in names and "kaisa_ds/engine/deepspeed_engine.py" in names
    assert not [n for n in names if "/tests/" in n or n.startswith("tests/")]


def test_the_wheels_requirements_are_the_librarys_and_the_rest_are_extras(wheel: Path) -> None:
    """The library needs torch and DeepSpeed; the HF integration, the report's plots and what the applications
    need are extras (``dev``, what scripts/setup.sh installs, holds them all)."""
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(meta_name).decode())
    requires = meta.get_all("Requires-Dist") or []
    core = sorted(r.split(">")[0].split("<")[0].split("=")[0].strip() for r in requires if "extra ==" not in r)
    assert core == ["deepspeed", "torch"], core
    extras = set(meta.get_all("Provides-Extra") or [])
    assert {"hf", "report", "apps", "dev"} <= extras, extras
    dev = {r.split(";")[0].split(">")[0].split("<")[0].strip() for r in requires if "extra == \"dev\"" in r}
    assert {"transformers", "accelerate", "matplotlib", "datasets", "tokenizers", "tqdm", "pytest"} <= dev, dev


def _env_without_pythonpath() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return env | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def test_outside_the_checkout_only_kaisa_ds_is_importable(tmp_path: Path) -> None:
    """What the environment installs (an editable install of this tree, as scripts/setup.sh makes): kaisa_ds, and
    none of the applications, once the checkout is not the working directory."""
    code = (f"import importlib.util, sys; sys.path = [p for p in sys.path if p not in ('', {str(REPO)!r})]; "
            f"print([n for n in {APPS!r} if importlib.util.find_spec(n)]); import kaisa_ds; print('kaisa_ds ok')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env_without_pythonpath(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    found, ok = proc.stdout.splitlines()
    assert found == "[]", (f"installed besides kaisa_ds: {found} (an install made before the wheel held kaisa_ds "
                           "only: run scripts/setup.sh again)")
    assert ok == "kaisa_ds ok"


def test_the_applications_run_from_the_repository_root() -> None:
    """``python -m mission`` / ``-m bert_pretrain`` as the README runs them: the working directory is the root."""
    for module in ("mission", "bert_pretrain", "squad_finetune"):
        proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, env=_env_without_pythonpath(),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and "usage" in proc.stdout, (module, proc.stderr[-2000:])


@pytest.mark.slow
def test_launcher_ranks_import_the_applications_without_pythonpath() -> None:
    """Ranks the launchers start from the repository root import the applications with nothing set: the deepspeed
    launcher puts its working directory on the ranks' PYTHONPATH (``--module bert_pretrain``, as the main job and
    the convergence study run it), and the example, run by path, puts its checkout on sys.path itself (torchrun
    adds nothing)."""
    env = _env_without_pythonpath()
    ds = subprocess.run([str(BIN / "deepspeed"), "--num_gpus", "1", "--module", "bert_pretrain", "--help"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert ds.returncode == 0 and "--max-steps" in ds.stdout, ds.stdout[-2000:] + ds.stderr[-2000:]
    tr = subprocess.run([str(BIN / "torchrun"), "--nproc_per_node", "1", "examples/hf_trainer_mlm.py", "--help"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert tr.returncode == 0 and "--deepspeed" in tr.stdout, tr.stdout[-2000:] + tr.stderr[-2000:]
