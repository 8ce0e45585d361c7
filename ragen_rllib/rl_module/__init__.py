"""RLlib RLModules (torch + transformers; imported only by the RLlib-facing layers)."""
