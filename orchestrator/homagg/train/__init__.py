"""Training with DDP, gradients summed by HomAgg (homagg.torch), next to Gloo.

- ``homagg.train.train``: ``homagg train`` on a local testbed: one rank per
  worker namespace (``python -m homagg.train.train --child SPEC``), the
  report, the replay that checks exactness, the plots.  Start here.
- ``homagg.train.remote``: the same run on an inventory's worker hosts
  (``homagg train -i``).
- ``homagg.train.models``: small versions of the paper's workloads, with
  generated data (``--model ncf|lstm|bert|vgg``).
"""
