"""Masked reductions over sampled tokens (pure torch).

Every function selects with ``torch.where`` instead of multiplying by the mask, so a NaN or
inf at a masked position (an unused log-prob, a padded value) cannot leak into the result or
into the gradient (``nan * 0`` is ``nan``; ``where`` picks 0 instead). Symbols as in
``ragen_rllib.core``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["masked_mean", "masked_sum", "masked_var", "masked_whiten"]


def _as_bool(mask: Tensor, like: Tensor) -> Tensor:
    """Return ``mask != 0`` as a bool tensor, after checking it broadcasts to ``like``."""
    if mask.shape != like.shape:
        try:
            torch.broadcast_shapes(mask.shape, like.shape)
        except RuntimeError as err:
            raise ValueError(f"mask shape {tuple(mask.shape)} does not broadcast to values "
                             f"shape {tuple(like.shape)}") from err
    return mask if mask.dtype == torch.bool else mask != 0


def _zero_outside(values: Tensor, keep: Tensor) -> Tensor:
    """Return ``values`` with every position where ``keep`` is False set to exactly 0."""
    return torch.where(keep, values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum ``values`` over the positions where ``mask`` is non-zero.

    Args:
        values: Any shape, float.
        mask: Same shape as ``values`` (or broadcastable to it), any dtype; non-zero = counted.
        dim: Reduce along this dimension only; ``None`` reduces over all elements.

    Returns:
        A 0-d tensor (``dim=None``) or ``values`` with ``dim`` removed; same dtype as
        ``values``. Masked positions contribute exactly 0.
    """
    picked = _zero_outside(values, _as_bool(mask, values))
    return picked.sum() if dim is None else picked.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Average ``values`` over the positions where ``mask`` is non-zero.

    An empty selection (no non-zero mask entry, overall or along ``dim``) gives 0, not NaN,
    so all-masked rows are harmless.

    Args:
        values: Any shape, float.
        mask: Same shape as ``values`` (or broadcastable to it), any dtype; non-zero = counted.
        dim: Reduce along this dimension only; ``None`` reduces over all elements.

    Returns:
        A 0-d tensor (``dim=None``) or ``values`` with ``dim`` removed; same dtype as
        ``values``.
    """
    keep = _as_bool(mask, values).expand_as(values)
    total = masked_sum(values, keep, dim)
    count = keep.sum() if dim is None else keep.sum(dim=dim)
    return total / count.clamp(min=1).to(values.dtype)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of ``values`` over all positions where ``mask`` is non-zero.

    Args:
        values: Any shape, float.
        mask: Same shape as ``values`` (or broadcastable to it), any dtype.
        unbiased: Divide by ``n - 1`` (Bessel's correction, as verl's ``masked_var``) instead
            of ``n``.

    Returns:
        0-d tensor, dtype of ``values``. Fewer than 2 selected elements (``unbiased``) or none
        (population) give 0.
    """
    keep = _as_bool(mask, values).expand_as(values)
    values = _zero_outside(values, keep)  # finite everywhere, so no NaN can reach the gradient
    mean = masked_mean(values, keep)
    sq_dev = masked_sum((values - mean) ** 2, keep)
    n = keep.sum().to(values.dtype)
    denom = n - 1 if unbiased else n
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    return torch.where(denom > 0, sq_dev / denom.clamp(min=1), zero)


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Whiten ``values`` with the mean and (unbiased) std of its masked-in positions.

    This is the batch-wide advantage whitening of PPO/GAE in RAGEN ("A is
    whitened over all masked tokens in the batch").

    Args:
        values: Any shape, float (typically ``(B, T)`` advantages).
        mask: Same shape, any dtype; statistics use only the non-zero positions.
        shift_mean: Subtract the mean (``True``) or only divide by the std and keep the
            original mean (``False``, used when the sign of the mean must be preserved).
        eps: Added to the variance before the square root.

    Returns:
        Same shape and dtype as ``values``: ``(x - mean) / sqrt(var + eps)`` (plus ``mean``
        again if not ``shift_mean``) at masked-in positions, exactly 0 elsewhere.
    """
    keep = _as_bool(mask, values).expand_as(values)
    values = _zero_outside(values, keep)
    mean = masked_mean(values, keep)
    var = masked_var(values, keep, unbiased=True)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return _zero_outside(whitened, keep)
