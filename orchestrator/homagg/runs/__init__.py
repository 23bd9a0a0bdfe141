"""Runs: one job on a placement, start to report.

``allreduce`` runs timed allreduces of generated gradients on a testbed and
returns the report; ``job`` is the worker process it starts (one per host);
``session`` keeps a job's workers alive between allreduces; ``demo`` holds
the three modes of ``homagg demo``.  Start with ``allreduce.run_allreduce``.
"""
