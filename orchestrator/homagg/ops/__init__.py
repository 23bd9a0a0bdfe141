"""Operating HomAgg: what the daemons and the workers report, read by people
and by Prometheus (docs/OPERATIONS.md).

- ``source``: one snapshot of a daemon from its control socket (``stats``
  and ``job_stats`` of every job), the common input of the two views below;
- ``exporter``: the Prometheus collector of ``homagg exporter`` over one or
  more daemons, queried at scrape time (the ``metrics`` extra);
- ``top``: the readings and the table of ``homagg top``;
- ``worker_metrics``: a training worker's own endpoint
  (``HOMAGG_METRICS_PORT``) with its per-allreduce statistics;
- ``logfmt``: ``--log-format json`` for the orchestrator's log;
- ``advise``: ``homagg advise``, the cost model's predicted time of ring
  all-reduce and of each HomAgg method on given links and gradients.

The command lines are homagg.cli.exporter, homagg.cli.top and
homagg.cli.advise.
"""
