"""Adapters that import other pool formats (EnvScaler, tau-bench) into this project's pool format.

May import: envs.*, sandbox.* (to replay gold actions), the standard library.
"""
