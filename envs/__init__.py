"""Pool format (envs.spec, envs.pool), validation, the builtin pool generator, adapters for other
pool formats, and operation-description extraction.

May import: pydantic, yaml, tqdm (the LLM pre-pass's progress bar), the standard library,
and ``sandbox`` inside functions only, in ``validate`` (running a pool's reference solutions) and
``adapters.taubench`` (replaying the gold actions): ``sandbox`` imports ``envs``, so an import at
module level would run up a floor. Never Ray, torch or ``launch`` (tests/test_layout.py).
"""
