"""The driver side of one training run, in one folder: a newcomer follows a step here.

- ``trainer.py``: ``train(cfg, run_dir)`` builds the roles, resumes, runs the controller, stops;
- ``controller.py``: the loop of one step (plans, admits, issues, collects, trains, publishes),
  over ``ledger.py`` (a group's whole life: tickets, placement, deadlines, retries, staleness)
  and ``control.py`` (the run's control file: pause, stop, resize);
- ``roles.py``: the Ray handles of every role (scheduler, rollout workers, learner, executors),
  with ``restarts.py`` (its Ray-free restart decisions), ``role_metrics.py`` (the step's role
  metrics) and
  ``roles_contract.py`` (what the controller needs of it);
- ``recovery.py``: rebuilding a lost learner group; ``checkpoint.py`` and ``resume.py``: run
  checkpoints and continuing from one; ``scheduler_journal.py``: the scheduler's per-step journal;
  ``scheduler_factory.py``: building the configured scheduler;
- ``metrics.py``, ``evaluation.py``, ``eval_pools.py``, ``split.py``: what a step logs, the
  fixed-set evaluation, its extra pools, and the held-out split.

May import: ``launch`` (config, cluster, errors, loggers, doctor, rollout, sft) and everything
below it; nothing outside ``launch/run/`` imports from it except the commands, ``compare``,
``doctor``-free benchmarks and tests (tests/test_layout.py).
"""
