"""StarPO / StarPO-S RLlib algorithms (installed as ragen_rllib.algorithms)."""
