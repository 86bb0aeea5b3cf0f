"""Adapters that import other pool formats (EnvScaler, tau-bench, BFCL) into this project's pool
format.

May import: envs.*, pydantic, the standard library; ``sandbox`` inside functions only (to replay
gold actions: ``sandbox`` imports ``envs``, so never at module level).
"""
