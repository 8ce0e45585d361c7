"""Pure StarPO / StarPO-S math: masked reductions, reward placement, the variance filter,
advantage estimators and losses. torch only (no ray, vllm, deepspeed, transformers, mlflow);
arguments are tensors and floats, never a config object.

Modules:

- ``masked``: ``masked_sum`` / ``masked_mean`` / ``masked_var`` / ``masked_whiten``.
- ``starpo``: reward placement, group statistics and the StarPO-S filter, GAE, turn-level
  (bi-level) GAE, GRPO advantages, the PPO policy loss, entropy, KL, value loss, metrics.

Symbols used in every shape in this package:

- ``B``: trajectories in a batch (one row per multi-turn episode).
- ``T``: padded token length of the batch (prompt + observation + sampled tokens).
- ``V``: vocabulary size (logits only).
- ``K``: turns of a trajectory; in a padded ``(B, K)`` tensor, the most turns of any row.
  In ``select_groups`` (StarPO-S filter) ``K`` is the number of *kept groups* instead;
  each docstring says which one it means.
- ``G``: prompt (initial-state) groups in the batch.
- ``N``: samples per group.

Masks: ``loss_mask`` is ``(B, T)``, any dtype, non-zero exactly on *sampled* tokens (tokens the
policy generated and is trained on); every other position (system prompt, chat template,
observations, padding) is "masked" and never influences any output of this package: not
through the forward value, and not through the gradient.

Units: log-probs in nats; rewards unitless (per turn or per episode); entropies and KL in
nats; lengths in tokens.

References: "RAGEN paper" is Wang et al. 2025, *RAGEN: Understanding Self-Evolution in LLM
Agents via Multi-Turn Reinforcement Learning*, arXiv:2504.20073 (v1); RAGEN and verl names
(``compute_gae_advantage_return``, ``_filter_rollout``, ...) are functions of their public code.
"""
