"""Pool format (envs.spec, envs.pool), validation, the builtin pool generator, adapters for other
pool formats, and operation-description extraction.

May import: pydantic, yaml, numpy, the standard library, and ``sandbox`` (for validation only).
Never Ray or torch.
"""
