"""LLM env runners and rollout engines (installed as ragen_rllib.env_runners)."""
