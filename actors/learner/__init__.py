"""GRPO loss, DeepSpeed learner group, and versioned weight sync."""
