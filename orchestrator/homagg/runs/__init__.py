"""Runs: one job on a placement, start to report.

``allreduce`` runs timed allreduces of generated gradients on a placement
(homagg.deploy.placement: a local testbed or inventory hosts) and returns
the report (``AllreduceReport``, the same fields on both); ``job`` is the worker process it starts (one per host);
``session`` keeps a job's workers alive between allreduces; ``demo`` holds
the three modes of ``homagg demo``; ``report`` what the report dataclasses
share (homagg.train.train.TrainReport too).  Start with ``allreduce.run_allreduce``.
"""
