"""Text environments (Bandit, Sokoban, FrozenLake, Countdown) behind one string contract.

Import-light: numpy only. Use ``make_env(name, variant=..., **config)``.
"""

from ragen_rllib.envs.base import TextEnv
from ragen_rllib.envs.registry import env_class, list_envs, list_variants, make_env, register_env

__all__ = ["TextEnv", "env_class", "list_envs", "list_variants", "make_env", "register_env"]
