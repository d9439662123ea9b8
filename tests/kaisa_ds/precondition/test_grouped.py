"""The grouped preconditioner's GPU alignment: padding an odd A size changes no number and doubles no memory."""

from __future__ import annotations

import pytest
import torch

from kaisa_ds.damping import Damping
from kaisa_ds.decomposition.decompose import decompose_all
from kaisa_ds.decomposition.registry import method_for
from kaisa_ds.decomposition.tensors import storage_bytes
from kaisa_ds.enums import ComputeMethod, DampingMode
from kaisa_ds.precondition.grouped import GroupedPreconditioner

IN, OUT = 5, 4  # a bias-augmented A of 5 (like BERT's 1025), unaligned; G of 4


def _spd(n: int, seed: int) -> torch.Tensor:
    x = torch.randn(3 * n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (x.t() @ x / (3 * n)).float()


def _setup(method: ComputeMethod) -> tuple[dict, dict[str, torch.Tensor]]:
    """Three layers reading one A (query/key/value) and a fourth with its own, each with its own G."""
    damping = Damping(DampingMode.ABSOLUTE, 0.1)
    factors = {"a_qkv": (_spd(IN, 0), False), "a_out": (_spd(IN, 1), False),
               **{f"g_{n}": (_spd(OUT, 2 + i), False) for i, n in enumerate("qkvo")}}
    decs = decompose_all(factors, method=method, damping=damping, compute_dtype=torch.float32,
                         out_dtype=torch.float32)
    pairs = {n: (decs["a_qkv"] if n != "o" else decs["a_out"], decs[f"g_{n}"]) for n in "qkvo"}
    grads = {n: torch.randn(OUT, IN, generator=torch.Generator().manual_seed(10 + i)) for i, n in enumerate("qkvo")}
    return pairs, grads


@pytest.mark.parametrize("method", [ComputeMethod.EIGEN, ComputeMethod.INVERSE])
def test_padding_odd_a_sizes_leaves_every_preconditioned_gradient_unchanged(method: ComputeMethod) -> None:
    damping = Damping(DampingMode.ABSOLUTE, 0.1)
    pairs, grads = _setup(method)
    plain = GroupedPreconditioner(method_for(method), align=1).apply(grads, pairs, damping=damping)
    pairs, grads = _setup(method)
    padded_pre = GroupedPreconditioner(method_for(method), align=8)
    padded = padded_pre.apply(grads, pairs, damping=damping)
    assert all(g.shape == (OUT, IN) for g in padded.values())
    for name in plain:
        torch.testing.assert_close(padded[name], plain[name], rtol=1e-5, atol=1e-6)
    # the stacks the matmuls read are aligned, and the decompositions view them (no second copy)
    a_mats = [g.a_mat for g in padded_pre._groups or []]
    assert a_mats and all(m is not None and m.shape[-1] % 8 == 0 and m.shape[-2] % 8 == 0 for m in a_mats)
    a_decs = [pairs["q"][0], pairs["o"][0]]
    attr = "eigvecs" if method is ComputeMethod.EIGEN else "inverse"
    assert all(getattr(d, attr).shape == (IN, IN) for d in a_decs)
    assert storage_bytes(a_decs) <= sum(m.numel() * m.element_size() for m in a_mats if m is not None) + sum(
        d.eigvals.numel() * 4 for d in a_decs if d.eigvals is not None)


def test_padding_is_off_on_the_cpu_by_default() -> None:
    pairs, grads = _setup(ComputeMethod.EIGEN)
    pre = GroupedPreconditioner(method_for(ComputeMethod.EIGEN))
    pre.apply(grads, pairs, damping=Damping(DampingMode.ABSOLUTE, 0.1))
    assert all(g.pad == 0 and g.a_mat is not None and g.a_mat.shape[-1] == IN for g in pre._groups or [])


@pytest.mark.parametrize("method", [ComputeMethod.EIGEN, ComputeMethod.INVERSE])
def test_layers_of_different_output_sizes_reading_one_input_are_each_preconditioned_as_alone(
        method: ComputeMethod) -> None:
    """Grouped-query attention: a query of 4 outputs and a key and value of 2 read one A factor. Grouped together
    they must give what each gives preconditioned alone, and the shared A is stacked once."""
    damping = Damping(DampingMode.ABSOLUTE, 0.1)
    sizes = {"q": OUT, "k": 2, "v": 2, "o": OUT}
    factors = {"a_qkv": (_spd(IN, 0), False), "a_out": (_spd(IN, 1), False),
               **{f"g_{n}": (_spd(d, 2 + i), False) for i, (n, d) in enumerate(sizes.items())}}

    def fresh() -> tuple[dict, dict[str, torch.Tensor]]:
        decs = decompose_all(factors, method=method, damping=damping, compute_dtype=torch.float32,
                             out_dtype=torch.float32)
        pairs = {n: (decs["a_qkv"] if n != "o" else decs["a_out"], decs[f"g_{n}"]) for n in sizes}
        grads = {n: torch.randn(d, IN, generator=torch.Generator().manual_seed(10 + i))
                 for i, (n, d) in enumerate(sizes.items())}
        return pairs, grads

    pairs, grads = fresh()
    pre = GroupedPreconditioner(method_for(method))
    together = pre.apply(grads, pairs, damping=damping)
    for name in sizes:
        alone_pairs, alone_grads = fresh()
        alone = GroupedPreconditioner(method_for(method)).apply(alone_grads, {name: alone_pairs[name]}, damping=damping)
        assert together[name].shape == (sizes[name], IN)
        torch.testing.assert_close(together[name], alone[name], rtol=1e-5, atol=1e-6)
    a_stacks = {g.a_mat.untyped_storage().data_ptr() for g in pre._groups or [] if g.a_mat is not None}
    assert len(a_stacks) == 2  # a_qkv once (read by the query group and the key/value group), a_out once
