"""Operating HomAgg: what the daemons and the workers report, read by people
and by Prometheus (docs/OPERATIONS.md).

- ``source``: one snapshot of a daemon from its control socket (``stats``
  and ``job_stats`` of every job), the common input of the two views below;
- ``exporter``: ``homagg exporter``, a Prometheus endpoint over one or more
  daemons, queried at scrape time (the ``metrics`` extra);
- ``top``: ``homagg top``, a live table of the jobs, workers and engines;
- ``worker_metrics``: a training worker's own endpoint
  (``HOMAGG_METRICS_PORT``) with its per-allreduce statistics;
- ``logfmt``: ``--log-format json`` for the orchestrator's log.
"""
