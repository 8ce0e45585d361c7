"""RAGEN-2's mutual-information diagnostics of *template collapse* (pure: torch only).

Template collapse: the policy's replies stop depending on the prompt. Reply entropy can stay
high while the reply is the same template for every input, so RAGEN-2 (2026, arXiv:2604.06268)
tracks the mutual information I(X; Z) between the prompt X and the reasoning Z instead, estimated
by in-batch cross-scoring: each sampled reply Z_i is scored under every prompt X_j of the batch,

    l(i, j) = log pi(Z_i | X_j)             (n samples x N prompt columns; c(i) is i's own column)

and

    matched_i  = l(i, c(i))                                          ~ log p(Z_i | X_i)
    marginal_i = logsumexp_j l(i, j) - ln N                           ~ log p(Z_i) (uniform mixture)
    MI         = mean(matched) - mean(marginal) = H(Z) - H(Z|X)       (<= ln N)
    z-score    = MI / (std(marginal) + eps)                           (population std)
    retrieval  = fraction of samples whose argmax_j l(i, j) has the prompt of c(i)

A collapsed policy scores its reply the same under every prompt: matched = marginal, MI = 0,
retrieval at chance. Columns whose prompts are token-identical (same *signature*) stay separate
for MI and count as the same answer for retrieval; the chance level accounts for them.

These are finite-sample estimates and can be negative. With per-token means of log-probs (RAGEN-2's
default, used for retrieval) the "mixture" is over exp(mean log-prob), a length-normalised proxy,
not a normalised distribution; ``_seq`` metrics use the summed log-probs instead.

Metric names (``echo/mi_*``) are the constants below; the caller logs the returned dict.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

__all__ = [
    "MI_CONDITIONAL_ENTROPY",
    "MI_ESTIMATE",
    "MI_ESTIMATE_SEQ",
    "MI_MARGINAL_STD",
    "MI_MARGINAL_STD_EMA",
    "MI_REPLY_ENTROPY",
    "MI_RETRIEVAL_ABOVE_CHANCE",
    "MI_RETRIEVAL_ACCURACY",
    "MI_RETRIEVAL_CHANCE",
    "MI_UPPER_BOUND",
    "MI_ZSCORE",
    "MI_ZSCORE_EMA",
    "MI_ZSCORE_SEQ",
    "STD_EPS",
    "collapse_metrics",
    "marginal_std_ema",
    "mi_estimate",
    "retrieval",
]

MI_ESTIMATE = "echo/mi_estimate"  # mean(matched) - mean(marginal), nats (per token unless _seq)
MI_UPPER_BOUND = "echo/mi_upper_bound"  # ln N
MI_CONDITIONAL_ENTROPY = "echo/mi_conditional_entropy"  # H(Z|X) estimate = -mean(matched)
MI_REPLY_ENTROPY = "echo/mi_reply_entropy"  # H(Z) estimate = -mean(marginal)
MI_MARGINAL_STD = "echo/mi_marginal_std"  # population std of marginal over the n samples
MI_ZSCORE = "echo/mi_zscore"  # MI / (marginal_std + eps)
MI_RETRIEVAL_ACCURACY = "echo/mi_retrieval_accuracy"
MI_RETRIEVAL_CHANCE = "echo/mi_retrieval_chance"
MI_RETRIEVAL_ABOVE_CHANCE = "echo/mi_retrieval_above_chance"  # accuracy - chance
MI_ESTIMATE_SEQ = "echo/mi_estimate_seq"  # as MI_ESTIMATE on summed (not per-token) log-probs
MI_ZSCORE_SEQ = "echo/mi_zscore_seq"
MI_MARGINAL_STD_EMA = "echo/mi_marginal_std_ema"  # see marginal_std_ema
MI_ZSCORE_EMA = "echo/mi_zscore_ema"  # MI / (marginal_std_ema + eps)

#: RAGEN-2's ``std_eps``: keeps the z-score finite when every marginal is equal.
STD_EPS = 1e-3


def _check(loglik: Tensor, column: Tensor) -> tuple[Tensor, Tensor]:
    if loglik.dim() != 2:
        raise ValueError(f"loglik must be (n, N), got shape {tuple(loglik.shape)}")
    n, num_cols = loglik.shape
    if n < 1 or num_cols < 2:
        raise ValueError(f"need >= 1 sample and >= 2 prompt columns, got loglik of shape {(n, num_cols)}")
    column = torch.as_tensor(column, dtype=torch.int64, device=loglik.device)
    if column.shape != (n,):
        raise ValueError(f"column must be ({n},), got shape {tuple(column.shape)}")
    if bool(((column < 0) | (column >= num_cols)).any()):
        raise ValueError(f"column values must be in [0, {num_cols}), got {sorted(set(column.tolist()))}")
    return loglik.detach().to(torch.float64), column


def mi_estimate(loglik: Tensor, column: Tensor, std_eps: float = STD_EPS) -> dict[str, float]:
    """Estimate I(X; Z) from cross-scored log-likelihoods (RAGEN-2 ``CollapseDetector``).

    Args:
        loglik: (n, N) float, ``l(i, j)`` = log-likelihood of sample i's reply under prompt
            column j, nats (per-token mean or sum; the estimate is in the same unit).
        column: (n,) int64, the true column c(i) of each sample.
        std_eps: added to the marginal std in the z-score's denominator.

    Returns:
        ``mi`` (= ``reply_entropy - conditional_entropy``), ``upper_bound`` (ln N),
        ``conditional_entropy`` (-mean matched), ``reply_entropy`` (-mean marginal),
        ``marginal_std`` (population std of marginal, divisor n) and
        ``zscore`` (mi / (marginal_std + std_eps)).

    Raises:
        ValueError: loglik is not (n, N) with n >= 1, N >= 2, or column is out of range.
    """
    ll, column = _check(loglik, column)
    num_cols = ll.shape[1]
    matched = ll.gather(1, column[:, None]).squeeze(1)  # (n,)
    marginal = torch.logsumexp(ll, dim=1) - math.log(num_cols)  # (n,) log of the uniform mixture over prompts
    mi = float(matched.mean() - marginal.mean())
    sigma = float(marginal.std(unbiased=False))
    return {"mi": mi, "upper_bound": math.log(num_cols), "conditional_entropy": float(-matched.mean()),
            "reply_entropy": float(-marginal.mean()), "marginal_std": sigma, "zscore": mi / (sigma + std_eps)}


def retrieval(loglik: Tensor, column: Tensor, signature: Sequence[Hashable]) -> dict[str, float]:
    """Prompt retrieval from cross-scored log-likelihoods: argmax_j l(i, j) against c(i).

    Ties go to the first (lowest) column, as in RAGEN-2. A prediction counts as a hit when its
    column has the same signature (prompt tokens) as the true column.

    Args:
        loglik: (n, N) float, per-token mean log-likelihoods (RAGEN-2 retrieves on these only).
        column: (n,) int64, the true column c(i) of each sample.
        signature: N hashables, one per column (e.g. the prompt's token tuple); equal
            signatures mark equivalent columns.

    Returns:
        ``accuracy``; ``chance`` = mean_i (#columns sharing sig(c(i))) / N, the accuracy of a
        uniformly random guess; ``above_chance`` = accuracy - chance.

    Raises:
        ValueError: as ``mi_estimate``, or ``signature`` does not have N entries.
    """
    ll, column = _check(loglik, column)
    num_cols = ll.shape[1]
    if len(signature) != num_cols:
        raise ValueError(f"signature must have one entry per column ({num_cols}), got {len(signature)}")
    first: dict[Hashable, int] = {}
    sig = torch.tensor([first.setdefault(s, j) for j, s in enumerate(signature)], dtype=torch.int64,
                       device=ll.device)  # (N,) each column's class: the first column with its signature
    class_size = torch.bincount(sig, minlength=num_cols)  # (N,) columns per class (0 for non-first columns)
    pred = ll.argmax(dim=1)  # (n,) first index among equal maxima
    accuracy = float((sig[pred] == sig[column]).double().mean())
    chance = float(class_size[sig[column]].double().mean() / num_cols)
    return {"accuracy": accuracy, "chance": chance, "above_chance": accuracy - chance}


def collapse_metrics(loglik: Tensor, column: Tensor, signature: Sequence[Hashable],
                     loglik_seq: Tensor | None = None, std_eps: float = STD_EPS) -> dict[str, float]:
    """All ``echo/mi_*`` metrics of one cross-scored pair set (RAGEN-2's metric set, our names).

    Args:
        loglik: (n, N) float, per-token mean log-likelihoods l_tok(i, j), nats.
        column: (n,) int64, the true column of each sample.
        signature: N hashables, the prompt identity of each column (see ``retrieval``).
        loglik_seq: (n, N) float summed log-likelihoods l_sum(i, j), or None (no ``_seq`` metrics).
        std_eps: see ``mi_estimate``.

    Returns:
        ``MI_ESTIMATE``, ``MI_UPPER_BOUND``, ``MI_CONDITIONAL_ENTROPY``, ``MI_REPLY_ENTROPY``,
        ``MI_MARGINAL_STD``, ``MI_ZSCORE``, ``MI_RETRIEVAL_*`` (and ``MI_ESTIMATE_SEQ``,
        ``MI_ZSCORE_SEQ`` with ``loglik_seq``) as floats.
    """
    mi, ret = mi_estimate(loglik, column, std_eps), retrieval(loglik, column, signature)
    out = {MI_ESTIMATE: mi["mi"], MI_UPPER_BOUND: mi["upper_bound"], MI_CONDITIONAL_ENTROPY: mi["conditional_entropy"],
           MI_REPLY_ENTROPY: mi["reply_entropy"], MI_MARGINAL_STD: mi["marginal_std"], MI_ZSCORE: mi["zscore"],
           MI_RETRIEVAL_ACCURACY: ret["accuracy"], MI_RETRIEVAL_CHANCE: ret["chance"],
           MI_RETRIEVAL_ABOVE_CHANCE: ret["above_chance"]}
    if loglik_seq is not None:
        seq = mi_estimate(loglik_seq, column, std_eps)
        out.update({MI_ESTIMATE_SEQ: seq["mi"], MI_ZSCORE_SEQ: seq["zscore"]})
    return out


def marginal_std_ema(previous: float | None, marginal_std: float, decay: float = 0.9) -> float:
    """RAGEN-2's EMA of the marginal std behind ``mi_zscore_ema`` = MI / (ema + eps).

    The first computation sets the EMA to the value; after that ``ema = decay * ema + (1 - decay) * x``
    (updated before use, once per computation).

    Args:
        previous: the EMA so far, or None before the first computation.
        marginal_std: this computation's ``MI_MARGINAL_STD``.
        decay: weight of the old EMA, in [0, 1).
    """
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"decay must be in [0, 1), got {decay!r}")
    return marginal_std if previous is None else decay * previous + (1.0 - decay) * marginal_std
