"""Multi-turn agent loop, inference engines (vLLM, transformers, scripted) and the rollout worker."""
