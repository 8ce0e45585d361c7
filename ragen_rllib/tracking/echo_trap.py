"""Echo-Trap early-warning signals, computed from the per-iteration metric dict (pure; stdlib + numpy).

RAGEN calls the collapse mode of multi-turn agent RL the *Echo Trap*: after an early rise, the
policy locks onto a few templated reasoning patterns, rewards stop varying within a prompt group,
and training collapses (often irreversibly). The paper tracks five diagnostics, all EMA-smoothed
(paper Figs. 5–8):

- ``std_collapse`` (``filter/std_all_mean``): in-group reward std drops *before* reward collapses
  (FrozenLake-PPO: std drops at step ~40, reward at ~90; Bandit-PPO: std bottoms at ~70).
- ``entropy_collapse`` (``actor/entropy``): rollout entropy falls as the policy narrows to one
  template.
- ``response_length_collapse`` (``rollout/response_length_mean``): think length declines
  (paper Fig. 11).
- ``grad_norm_spike`` (``actor/grad_norm``): grad-norm spikes mark irreversible collapse (~170
  Bandit, ~110 Sokoban, ~90 FrozenLake).
- ``identical_responses`` (``rollout/identical_response_frac``): identical templated reasoning
  across samples (paper Table 1; RAGEN issue #52: Sokoban output degenerates to "!!!!!").
- ``mi_collapse`` (``echo/mi_zscore``, ``echo/mi_retrieval_above_chance``; only in runs that
  compute them, ``StarPOParams.mi_every``): RAGEN-2's (2026) *template collapse*, replies that no
  longer depend on the prompt, measured as the mutual information between prompt and reply
  (``ragen_rllib.core.collapse``). It can hide behind a high entropy.
- ``format_drift`` (``rollout/well_formed_rate``): not one of the paper's signals. The share of
  malformed replies rises well above the lowest it reached in the run: the policy drifts out of
  the reply format (e.g. replies that grow until they are cut at the response-length limit). In
  this project's FrozenLake runs a collapse came this way, with none of the signals above.
- ``reply_growth`` (``rollout/tokens_per_turn``): not one of the paper's signals either, the
  opposite of ``response_length_collapse``: the reply length per turn grows well above the
  shortest it reached. In this project's FrozenLake runs (bare ``<answer>`` replies of ~6
  tokens) it fired before the validation that showed a fall in 5 of 12 falls (all four of the
  seed run after its threshold was fixed, none of the seed before that), with the immediate
  format break in 2, after it in 4 and never in 1, and it also fired in 3 of 5 runs without a
  fall: a hint, not a verdict (docs/results.md).
- ``reply_jump`` (``rollout/tokens_per_turn``): ours as well, a sharper form of ``reply_growth``
  on raw values: the reply length per turn jumps above a multiple of the lowest of the previous
  ``window`` iterations. Slow growth does not fire it (1.1x an iteration stays under 1.7x over
  5), a jump within a few updates does. Its rule was chosen on the same 17 FrozenLake runs: before
  the fall's validation in 9 of 12 falls, in none of 5 runs without a fall (in sample; out of
  sample in docs/results.md).

RAGEN itself only *prevents* the trap (StarPO-S filtering, clip-higher, no KL) and has no
detector. ``EchoTrapMonitor`` is that detector: feed it the metric dict of
every iteration; it returns the signals that switched on at that step, and ``flags()`` gives
``echo/<signal>`` 0/1 values to log next to the other metrics. It never changes training.

The thresholds are heuristics (the paper gives curves, not detection rules); they are fields of the
monitor so an experiment can tune them.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

# Metric keys the monitor reads (defaults of the monitor's ``*_key`` fields). They follow the
# project's namespaces ; the producer of each metric owns its definition.
STD_KEY = "filter/std_all_mean"  # mean over all groups of the in-group reward std (before filtering)
SUCCESS_KEY = "rollout/success"  # fraction of successful episodes in the iteration's rollouts
ENTROPY_KEY = "actor/entropy"  # token-mean policy entropy, nats
GRAD_NORM_KEY = "actor/grad_norm"  # global grad norm before clipping
RESPONSE_LENGTH_KEY = "rollout/response_length_mean"  # mean sampled tokens per trajectory
IDENTICAL_KEY = "rollout/identical_response_frac"  # see identical_response_fraction()
MI_ZSCORE_KEY = "echo/mi_zscore"  # MI estimate / std of the marginal (ragen_rllib.core.collapse)
MI_ABOVE_CHANCE_KEY = "echo/mi_retrieval_above_chance"  # prompt retrieval accuracy - chance level
WELL_FORMED_KEY = "rollout/well_formed_rate"  # fraction of sampled turns that parse as a valid reply
TOKENS_PER_TURN_KEY = "rollout/tokens_per_turn"  # mean sampled tokens per turn (reply length, tokens)

STD_COLLAPSE = "std_collapse"
ENTROPY_COLLAPSE = "entropy_collapse"
GRAD_NORM_SPIKE = "grad_norm_spike"
RESPONSE_LENGTH_COLLAPSE = "response_length_collapse"
IDENTICAL_RESPONSES = "identical_responses"
MI_COLLAPSE = "mi_collapse"
FORMAT_DRIFT = "format_drift"
REPLY_GROWTH = "reply_growth"
REPLY_JUMP = "reply_jump"
#: All signal names, in the order ``update`` evaluates them.
SIGNALS = (STD_COLLAPSE, ENTROPY_COLLAPSE, GRAD_NORM_SPIKE, RESPONSE_LENGTH_COLLAPSE, IDENTICAL_RESPONSES,
           MI_COLLAPSE, FORMAT_DRIFT, REPLY_GROWTH, REPLY_JUMP)
#: Prefix of the 0/1 flag metrics returned by ``EchoTrapMonitor.flags``.
FLAG_PREFIX = "echo/"


def identical_response_fraction(responses: Sequence[str], group_ids: Sequence[int]) -> float:
    """Return the fraction of prompt groups whose sampled responses are all identical.

    Only groups with at least two members count (a single response is trivially "identical").
    Responses are compared as exact strings, so this catches the paper's "identical templated
    reasoning across samples" (Table 1) and degenerate outputs such as "!!!!!", not paraphrases.
    In an env whose whole reply is a bare action (no reasoning) identical replies are expected
    once the policy has converged; the signal is meant for runs with reasoning.

    Args:
        responses: ``(B,)`` decoded response texts (e.g. all turns of a trajectory joined).
        group_ids: ``(B,)`` prompt-group id of each response.

    Returns:
        A fraction in [0, 1]; 0.0 when no group has two or more responses.

    Raises:
        ValueError: if the two sequences differ in length.
    """
    if len(responses) != len(group_ids):
        raise ValueError(f"responses ({len(responses)}) and group_ids ({len(group_ids)}) differ in length")
    groups: dict[int, list[str]] = {}
    for text, g in zip(responses, group_ids, strict=False):
        groups.setdefault(int(g), []).append(text)
    sized = [texts for texts in groups.values() if len(texts) >= 2]
    if not sized:
        return 0.0
    return sum(len(set(texts)) == 1 for texts in sized) / len(sized)


@dataclass(frozen=True)
class EchoTrapSignal:
    """One Echo-Trap warning that switched on at ``step``.

    Attributes:
        name: one of ``SIGNALS``.
        step: the training iteration at which the condition became true.
        value: the (EMA-smoothed, unless stated in ``message``) metric value that tripped it.
        reference: what it was compared with (running max, early EMA, recent median, threshold).
        message: one human-readable line, naming the metric, the numbers and the rule.
    """

    name: str
    step: int
    value: float
    reference: float
    message: str


@dataclass
class EchoTrapMonitor:
    """Watch the per-iteration metrics for the Echo-Trap collapse pattern.

    Call ``update(metrics, step)`` once per training iteration with the full metric dict. Missing
    keys and non-finite values are skipped (that signal is simply not evaluated at that step),
    except a non-finite grad norm, which counts as a spike. EMA-smoothed signals need ``window``
    observations before they can fire (warm-up); ``identical_responses`` uses an absolute threshold
    and can fire at once, and ``format_drift`` and ``reply_growth`` compare with their own lowest
    EMA from the start; ``reply_jump`` compares raw values with the previous ``window`` ones.

    ``update`` returns only the signals that switched *on* at that step (one warning per episode of
    trouble, not one per iteration); ``active`` and ``flags()`` give the current state of all signals.

    Attributes:
        window: warm-up length in observations for the EMA references, the number of previous
            grad norms whose median a new grad norm is compared with, and the number of previous
            reply lengths whose lowest a new one is compared with (``reply_jump``).
        ema_alpha: EMA weight of the newest value (``ema = a*x + (1-a)*ema``); the paper plots
            EMA-smoothed curves. 0.3 ≈ an effective memory of about three iterations.
        std_collapse_frac: ``std_collapse`` fires when the EMA of ``std_key`` falls below this
            fraction of its running max ...
        std_success_rise: ... unless the success EMA has risen by at least this much since the step
            of that max (reward std also drops when the task gets *solved*) ...
        solved_success: ... or the success EMA is at least this high. Without a success metric only
            the std rule applies.
        entropy_collapse_frac: ``entropy_collapse`` fires when the entropy EMA falls below this
            fraction of its early EMA (the EMA after ``window`` observations).
        grad_norm_spike_k: ``grad_norm_spike`` fires when a raw grad norm exceeds this multiple of
            the median of the previous ``window`` grad norms (or is non-finite).
        response_length_frac: ``response_length_collapse`` fires when the response-length EMA falls
            below this fraction of its early EMA.
        identical_frac_threshold: ``identical_responses`` fires when the raw fraction of groups with
            all-identical responses exceeds this value.
        mi_zscore_min: ``mi_collapse`` fires when the EMA of the MI z-score falls below this value
            after having been at or above it (a run whose replies never depended on the prompt
            does not raise it from its first iteration) ...
        mi_above_chance_min: ... or the same for retrieval accuracy above chance; either may be
            None (that half off). Not while the success EMA is at least ``solved_success``: a
            solved task with one right answer (the Bandit) needs no prompt-dependent reply. The
            MI metrics come every few iterations, so the EMA's memory is in computations.
        format_drift_rise: ``format_drift`` fires when the EMA of the malformed share
            (1 - ``well_formed_key``) exceeds its lowest EMA so far by more than this (an
            absolute share), from the second iteration on (no warm-up). The lowest value, not
            the early one, is the reference, so a run that starts malformed and learns the format
            does not fire, and one that loses it does, in its first update too.
        reply_growth_frac: ``reply_growth`` fires when the EMA of the reply length per turn
            (``tokens_per_turn_key``) exceeds this multiple of its lowest EMA so far, from the second
            iteration on (no warm-up). 1.5 was chosen on this project's FrozenLake runs at actor LR
            5e-5 and 1e-5 (docs/results.md), where it fired before the deepest point of both
            format-drift falls and also in two runs without a significant fall; on the next seed
            it fired after both falls, on the one after that before all four.
        reply_jump_frac: ``reply_jump`` fires when the raw reply length per turn exceeds this
            multiple of the lowest of the previous ``window`` raw values (from the second
            iteration on; a reference of 0 never fires). 1.7 was chosen on the same FrozenLake
            runs, 1.6-1.8 giving the same alarms there: before 9 of 12 falls and in 0 of 5 runs
            without one, in sample.
        std_key, success_key, entropy_key, grad_norm_key, response_length_key, identical_key,
            mi_zscore_key, mi_above_chance_key, well_formed_key, tokens_per_turn_key: the metric keys
            read (module constants ``*_KEY``).
    """

    window: int = 5
    ema_alpha: float = 0.3
    std_collapse_frac: float = 0.3
    std_success_rise: float = 0.2
    solved_success: float = 0.95
    entropy_collapse_frac: float = 0.3
    grad_norm_spike_k: float = 5.0
    response_length_frac: float = 0.5
    identical_frac_threshold: float = 0.5
    mi_zscore_min: float | None = 0.5
    mi_above_chance_min: float | None = 0.05
    format_drift_rise: float = 0.1
    reply_growth_frac: float = 1.5
    reply_jump_frac: float = 1.7
    std_key: str = STD_KEY
    success_key: str = SUCCESS_KEY
    entropy_key: str = ENTROPY_KEY
    grad_norm_key: str = GRAD_NORM_KEY
    response_length_key: str = RESPONSE_LENGTH_KEY
    identical_key: str = IDENTICAL_KEY
    mi_zscore_key: str = MI_ZSCORE_KEY
    mi_above_chance_key: str = MI_ABOVE_CHANCE_KEY
    well_formed_key: str = WELL_FORMED_KEY
    tokens_per_turn_key: str = TOKENS_PER_TURN_KEY

    _ema: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _count: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _early: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _std_max: float = field(default=0.0, init=False, repr=False)
    _success_at_std_max: float | None = field(default=None, init=False, repr=False)
    _grad_norms: deque = field(default_factory=deque, init=False, repr=False)
    _reply_lengths: deque = field(default_factory=deque, init=False, repr=False)  # raw, the last ``window``
    _mi_armed: set = field(default_factory=set, init=False, repr=False)  # MI keys whose EMA reached the threshold
    _lowest: dict[str, float] = field(default_factory=dict, init=False, repr=False)  # lowest EMA so far, per key
    _active: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(SIGNALS, False), init=False, repr=False)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"EchoTrapMonitor.window must be >= 1, got {self.window}")
        if not 0.0 < self.ema_alpha <= 1.0:
            raise ValueError(f"EchoTrapMonitor.ema_alpha must be in (0, 1], got {self.ema_alpha}")
        for name in ("std_collapse_frac", "entropy_collapse_frac", "response_length_frac"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"EchoTrapMonitor.{name} must be in (0, 1), got {getattr(self, name)}")
        if not 0.0 <= self.identical_frac_threshold < 1.0:
            raise ValueError(
                f"EchoTrapMonitor.identical_frac_threshold must be in [0, 1), got {self.identical_frac_threshold}")
        if self.grad_norm_spike_k <= 1.0:
            raise ValueError(f"EchoTrapMonitor.grad_norm_spike_k must be > 1, got {self.grad_norm_spike_k}")
        for name in ("mi_zscore_min", "mi_above_chance_min"):
            if getattr(self, name) is not None and _finite(getattr(self, name)) is None:
                raise ValueError(f"EchoTrapMonitor.{name} must be a finite number or None, got {getattr(self, name)!r}")
        if not 0.0 < self.format_drift_rise < 1.0:
            raise ValueError(f"EchoTrapMonitor.format_drift_rise must be in (0, 1), got {self.format_drift_rise}")
        for name in ("reply_growth_frac", "reply_jump_frac"):
            if not (getattr(self, name) > 1.0 and math.isfinite(getattr(self, name))):
                raise ValueError(f"EchoTrapMonitor.{name} must be a finite number > 1, got {getattr(self, name)}")
        self._grad_norms = deque(maxlen=self.window)
        self._reply_lengths = deque(maxlen=self.window)

    @property
    def active(self) -> dict[str, bool]:
        """Return whether each signal's condition held at its last evaluation."""
        return dict(self._active)

    def flags(self) -> dict[str, float]:
        """Return ``{"echo/<signal>": 0.0 | 1.0}`` for all signals, to log with the step's metrics."""
        return {FLAG_PREFIX + name: float(on) for name, on in self._active.items()}

    def update(self, metrics: Mapping[str, float], step: int) -> list[EchoTrapSignal]:
        """Feed one iteration's metrics; return the signals that switched on at this step.

        Args:
            metrics: the iteration's metric dict (other keys are ignored).
            step: the training iteration, copied into the returned signals.

        Returns:
            The newly active signals, in ``SIGNALS`` order (empty when nothing changed for the worse).
        """
        success = self._observe(metrics, self.success_key)
        checks = (
            self._check_std(metrics, success),
            self._check_drop(metrics, ENTROPY_COLLAPSE, self.entropy_key, self.entropy_collapse_frac,
                             "policy entropy", "the policy is narrowing to one template"),
            self._check_grad_norm(metrics),
            self._check_drop(metrics, RESPONSE_LENGTH_COLLAPSE, self.response_length_key, self.response_length_frac,
                             "response length", "reasoning is shrinking (paper Fig. 11)"),
            self._check_identical(metrics),
            self._check_mi(metrics, success),
            self._check_format(metrics),
            self._check_reply_growth(metrics),
            self._check_reply_jump(metrics),
        )
        fired = []
        for name, check in zip(SIGNALS, checks, strict=False):
            if check is None:  # metric missing this step: keep the previous state
                continue
            on, value, reference, message = check
            if on and not self._active[name]:
                fired.append(EchoTrapSignal(name, int(step), value, reference, f"[echo-trap] step {step}: {message}"))
            self._active[name] = on
        return fired

    # -- internals -------------------------------------------------------------------------

    def _observe(self, metrics: Mapping[str, float], key: str) -> float | None:
        """Update the EMA of ``key`` (and its early reference); return the EMA or None if absent."""
        x = _finite(metrics.get(key))
        if x is None:
            return self._ema.get(key)
        prev = self._ema.get(key)
        ema = x if prev is None else self.ema_alpha * x + (1.0 - self.ema_alpha) * prev
        self._ema[key] = ema
        self._count[key] = self._count.get(key, 0) + 1
        if self._count[key] == self.window:
            self._early[key] = ema
        return ema

    def _lowest_so_far(self, key: str, ema: float) -> float:
        """Record ``ema`` as the lowest EMA of ``key`` if it is; return the lowest so far."""
        self._lowest[key] = min(ema, self._lowest.get(key, ema))
        return self._lowest[key]

    def _check_std(self, metrics, success):
        if _finite(metrics.get(self.std_key)) is None:
            return None
        ema = self._observe(metrics, self.std_key)
        if ema > self._std_max:
            self._std_max, self._success_at_std_max = ema, success
        if self._count[self.std_key] < self.window or self._std_max <= 0.0:
            return False, ema, self._std_max, ""
        solved = success is not None and (
            success >= self.solved_success
            or (self._success_at_std_max is not None and success - self._success_at_std_max >= self.std_success_rise))
        on = ema < self.std_collapse_frac * self._std_max and not solved
        msg = (f"in-group reward std {self.std_key} (EMA {ema:.4g}) fell below {self.std_collapse_frac:g} x its "
               f"running max {self._std_max:.4g} while success did not rise "
               f"(EMA {_fmt(success)}, {_fmt(self._success_at_std_max)} at the max): the StarPO-S filter is "
               "running out of informative groups; reward collapse usually follows (RAGEN Echo Trap).")
        return on, ema, self._std_max, msg

    def _check_drop(self, metrics, name, key, frac, what, meaning):
        if _finite(metrics.get(key)) is None:
            return None
        ema = self._observe(metrics, key)
        early = self._early.get(key)
        if early is None or early <= 0.0:
            return False, ema, float("nan") if early is None else early, ""
        on = ema < frac * early
        msg = f"{what} {key} (EMA {ema:.4g}) fell below {frac:g} x its early EMA {early:.4g}: {meaning}."
        return on, ema, early, msg

    def _check_grad_norm(self, metrics):
        raw = metrics.get(self.grad_norm_key)
        if raw is None:
            return None
        try:
            value = float(raw)
        except (TypeError, ValueError):
            return None
        recent = self._grad_norms
        median = float(np.median(recent)) if len(recent) == self.window else float("nan")
        if not math.isfinite(value):
            return True, value, median, (f"{self.grad_norm_key} is {value}: the update blew up "
                                         "(RAGEN: grad-norm spikes mark irreversible collapse).")
        recent.append(value)
        if math.isnan(median) or median <= 0.0:
            return False, value, median, ""
        on = value > self.grad_norm_spike_k * median
        msg = (f"{self.grad_norm_key} = {value:.4g} is more than {self.grad_norm_spike_k:g} x the median "
               f"{median:.4g} of the previous {self.window}: RAGEN saw such spikes at irreversible collapse.")
        return on, value, median, msg

    def _check_identical(self, metrics):
        value = _finite(metrics.get(self.identical_key))
        if value is None:
            return None
        on = value > self.identical_frac_threshold
        msg = (f"{self.identical_key} = {value:.3g} > {self.identical_frac_threshold:g}: most prompt groups sampled "
               "identical responses (templated reasoning, paper Table 1).")
        return on, value, self.identical_frac_threshold, msg

    def _check_mi(self, metrics, success):
        below, seen = [], False
        for key, threshold, what in ((self.mi_zscore_key, self.mi_zscore_min, "MI z-score"),
                                     (self.mi_above_chance_key, self.mi_above_chance_min,
                                      "retrieval accuracy above chance")):
            if threshold is None or _finite(metrics.get(key)) is None:
                continue
            seen = True
            ema = self._observe(metrics, key)
            if ema >= threshold:
                self._mi_armed.add(key)
            elif key in self._mi_armed:
                below.append((key, ema, threshold, what))
        if not seen:
            return None
        if not below or (success is not None and success >= self.solved_success):
            return False, float("nan"), float("nan"), ""
        key, ema, threshold, what = below[0]
        msg = (f"{what} {key} (EMA {ema:.4g}) fell below {threshold:g}: replies depend less and less on the "
               "prompt (RAGEN-2 template collapse), whatever their entropy.")
        return True, ema, threshold, msg

    def _check_format(self, metrics):
        well_formed = _finite(metrics.get(self.well_formed_key))
        if well_formed is None:
            return None
        key = "malformed:" + self.well_formed_key  # the EMA is of 1 - well-formed rate
        ema = self._observe({key: 1.0 - well_formed}, key)
        # No warm-up: the reference is the lowest EMA so far, from the first iteration on, so a
        # policy that loses the format in its first update is caught, and one that starts
        # malformed and learns the format is not (its EMA only falls).
        lowest = self._lowest_so_far(key, ema)
        on = ema > lowest + self.format_drift_rise
        msg = (f"the malformed share 1 - {self.well_formed_key} (EMA {ema:.3g}) rose more than "
               f"{self.format_drift_rise:g} above its lowest EMA {lowest:.3g}: the policy is drifting "
               "out of the reply format (over-long replies cut at the length limit, for one).")
        return on, ema, lowest, msg

    def _check_reply_growth(self, metrics):
        if _finite(metrics.get(self.tokens_per_turn_key)) is None:
            return None
        ema = self._observe(metrics, self.tokens_per_turn_key)
        lowest = self._lowest_so_far(self.tokens_per_turn_key, ema)  # as format_drift: no warm-up
        if lowest <= 0.0:
            return False, ema, lowest, ""
        on = ema > self.reply_growth_frac * lowest
        msg = (f"reply length {self.tokens_per_turn_key} (EMA {ema:.3g} tokens) grew above "
               f"{self.reply_growth_frac:g} x its shortest EMA {lowest:.3g}: replies are growing; in this "
               "project's FrozenLake runs such growth went with format drift and falls in success, and "
               "also came without a fall.")
        return on, ema, lowest, msg


    def _check_reply_jump(self, metrics):
        x = _finite(metrics.get(self.tokens_per_turn_key))
        if x is None:
            return None
        previous = min(self._reply_lengths, default=None)
        n_previous = len(self._reply_lengths)  # counted before this value joins the window
        self._reply_lengths.append(x)
        if previous is None or previous <= 0.0:
            return False, x, float("nan") if previous is None else previous, ""
        on = x > self.reply_jump_frac * previous
        iterations = "iteration" if n_previous == 1 else "iterations"
        msg = (f"reply length {self.tokens_per_turn_key} ({x:.3g} tokens) jumped above {self.reply_jump_frac:g} x "
               f"the lowest of the previous {n_previous} {iterations} ({previous:.3g}): in this project's "
               "FrozenLake runs such jumps came before most falls in success.")
        return on, x, previous, msg


def _finite(x: object) -> float | None:
    """Return ``float(x)`` if it is a finite number, else None."""
    if x is None:
        return None
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"
