"""ragen-rllib: RAGEN's StarPO / StarPO-S multi-turn agent RL on Ray RLlib.

Importing the package is cheap: no ray, vllm, deepspeed, transformers or mlflow at import time.
"""

__version__ = "0.1.0"
