"""``TorchBackend.step``: one norm per gradient instead of RLlib's two isfinite passes, with
RLlib's own update on finite gradients and RLlib's nan/inf policy otherwise."""

from __future__ import annotations

import types

import pytest
import torch

from ragen_rllib.algorithms.starpo.backends import TorchBackend, all_finite


def test_all_finite_finds_nan_and_inf_anywhere() -> None:
    ts = [torch.randn(7, 5), torch.randn(3), torch.zeros(0)]
    assert all_finite(ts) and all_finite([])
    for bad in (float("nan"), float("inf"), float("-inf")):
        ts[0][4, 2] = bad
        assert not all_finite(ts)
        ts[0][4, 2] = 0.0
    assert all_finite([torch.full((4,), 1e30, dtype=torch.bfloat16)]) is False  # norm overflows: careful path


def _learner(seed: int) -> types.SimpleNamespace:
    """What TorchBackend.step and RLlib's TorchLearner.apply_gradients read of a learner."""
    torch.manual_seed(seed)
    actor, critic = torch.nn.Linear(4, 3), torch.nn.Linear(3, 1)
    opts = {"actor": torch.optim.AdamW(actor.parameters(), lr=0.1),
            "critic": torch.optim.AdamW(critic.parameters(), lr=0.2)}
    params = {f"p{i}": q for i, q in enumerate([*actor.parameters(), *critic.parameters()])}
    return types.SimpleNamespace(
        _params=params, _module_optimizers={"default": ["actor", "critic"]}, _lr_scheduler_classes=None,
        _grad_scalers=None, _optimizer_parameters={o: list(o.param_groups[0]["params"]) for o in opts.values()},
        config=types.SimpleNamespace(torch_skip_nan_gradients=False),
        get_optimizer=lambda module_id, name: opts[name])


@pytest.mark.parametrize("poison", [None, float("nan"), float("inf")])
def test_step_equals_rllibs_apply_gradients(poison) -> None:
    from ray.rllib.core.learner.torch.torch_learner import TorchLearner

    ours, rllib = _learner(0), _learner(0)
    g = torch.Generator().manual_seed(1)
    grads = {pid: torch.randn(q.shape, generator=g) for pid, q in ours._params.items()}
    if poison is not None:
        grads["p1"][0] = poison
    TorchBackend(ours, 0.1, 0.2).step({k: v.clone() for k, v in grads.items()})
    TorchLearner.apply_gradients(rllib, {k: v.clone() for k, v in grads.items()})
    for pid in grads:
        assert torch.equal(ours._params[pid], rllib._params[pid]), pid
        assert ours._params[pid].grad is None  # freed after the step
    assert all(torch.isfinite(q).all() for q in ours._params.values())


@pytest.mark.parametrize("scale,poison", [(1.0, None), (100.0, None), (1.0, float("nan")), (1.0, float("inf"))])
def test_clip_by_global_norm_equals_rllibs_clip_gradients(scale: float, poison: float | None) -> None:
    """Same pre-clip norm and clipped gradients as RLlib's global-norm clipping (scale 100: the
    norm is far above the clip value, so every tensor is scaled down); nan/inf: not finite."""
    from ray.rllib.utils.torch_utils import clip_gradients

    from ragen_rllib.algorithms.starpo.backends import clip_by_global_norm

    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(shape, generator=g) * scale for shape in [(7, 5), (3,), (2, 2, 2)]]
    if poison is not None:
        grads[1][0] = poison
    ours = [t.clone() for t in grads]
    rllib = {i: t.clone() for i, t in enumerate(grads)}
    total, finite = clip_by_global_norm(ours, 1.0)
    rllib_total = clip_gradients(rllib, grad_clip=1.0, grad_clip_by="global_norm")
    assert finite is (poison is None)
    torch.testing.assert_close(total, rllib_total, rtol=1e-6, atol=0.0)
    for i, t in enumerate(ours):
        torch.testing.assert_close(t, rllib[i], rtol=1e-6, atol=0.0, equal_nan=True)
    if poison is None and scale == 100.0:
        assert abs(float(torch.linalg.vector_norm(torch.cat([t.flatten() for t in ours]))) - 1.0) < 1e-5
    assert clip_by_global_norm([], 1.0) == (torch.tensor(0.0), True)
