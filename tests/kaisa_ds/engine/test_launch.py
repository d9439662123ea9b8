"""kaisa_ds.engine.launch: DeepSpeed's CPU shm op is marked incompatible unless the user opts back in."""

from __future__ import annotations

import pytest

from kaisa_ds.engine.launch import SHM_OPT_IN, free_port, skip_cpu_shm_build


@pytest.fixture
def compatible_ops(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    import deepspeed.ops

    ops = {"deepspeed_shm_comm": True, "fused_adam": True}
    monkeypatch.setattr(deepspeed.ops, "__compatible_ops__", ops, raising=False)
    return ops


def test_cpu_shm_op_is_skipped_and_others_are_untouched(compatible_ops: dict[str, bool],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SHM_OPT_IN, raising=False)
    skip_cpu_shm_build()
    assert compatible_ops == {"deepspeed_shm_comm": False, "fused_adam": True}


def test_opt_in_keeps_deepspeeds_default(compatible_ops: dict[str, bool], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SHM_OPT_IN, "1")
    skip_cpu_shm_build()
    assert compatible_ops["deepspeed_shm_comm"] is True


def test_free_port_is_a_usable_port() -> None:
    assert 0 < free_port() < 65536
