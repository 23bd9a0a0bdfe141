"""Training with DDP, gradients summed by HomAgg (homagg.torch), next to Gloo.

- ``homagg.train.train``: ``homagg train``: ``run_train`` over a placement
  (homagg.deploy.placement: a local testbed's namespaces or, with ``-i``, an
  inventory's hosts over SSH), one rank per worker host (``python -m
  homagg.train.train --child SPEC``), the TrainReport, the replay that
  checks exactness, the plots.  Start here.
- ``homagg.train.models``: small versions of the paper's workloads, with
  generated data (``--model ncf|lstm|bert|vgg``).
"""
