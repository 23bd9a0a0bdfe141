"""HomAgg: in-network gradient aggregation with lossless homomorphic compression.

Where to start reading:

- ``homagg.codec``: the compression arithmetic (C kernels through cffi) and
  ``simulate_allreduce``, the whole protocol in one process.
- ``homagg.errors``: the one exception tree every layer raises.
- ``homagg.cli``: the ``homagg`` command (``homagg --help``).

The C side lives in ``dataplane_c/`` (public headers in
``dataplane_c/include/homagg/``) and ``nic/`` (the software NIC model).
"""

__version__ = "0.1.0"
