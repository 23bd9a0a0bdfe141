"""HomAgg: in-network gradient aggregation with lossless homomorphic compression.

Where to start reading:

- ``homagg.codec``: the compression arithmetic (C kernels through cffi) and
  ``simulate_allreduce``, the whole protocol in one process.
- ``homagg.errors``: the one exception tree every layer raises.
- ``homagg.cli``: the ``homagg`` command (``homagg --help``).

Beside the public API at the top (protocol, codec, cost, kernels, engine,
worker, nic, sim, auth, reference, torch, errors), the subpackages: ``homagg.switch``
(the aggregator daemon, its control client, job files), ``homagg.deploy``
(``local``: a testbed of namespaces; ``remote``: inventory hosts over SSH),
``homagg.runs`` (allreduce jobs), ``homagg.train`` (DDP training),
``homagg.bench`` (benchmarks), ``homagg.ops`` (metrics, the live view,
JSON logs) and ``homagg.cli``.  Each one's docstring says
where to start.

The C side lives in ``dataplane_c/`` (public headers in
``dataplane_c/include/homagg/``) and ``nic/`` (the software NIC model).
"""

import logging

__version__ = "0.1.0"

# Every module logs under "homagg" (homagg.log); a program using the package
# sees nothing unless it configures logging (the homagg command does).
logging.getLogger("homagg").addHandler(logging.NullHandler())
