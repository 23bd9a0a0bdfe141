"""HomAgg: in-network gradient aggregation with lossless homomorphic compression.

Where to start reading:

- ``homagg.codec``: the compression arithmetic (C kernels through cffi) and
  ``simulate_allreduce``, the whole protocol in one process.
- ``homagg.errors``: the one exception tree every layer raises.
- ``homagg.cli``: the ``homagg`` command (``homagg --help``).

The C side lives in ``dataplane_c/`` (public headers in
``dataplane_c/include/homagg/``) and ``nic/`` (the software NIC model).
"""

import logging

__version__ = "0.1.0"

# Every module logs under "homagg" (homagg.log); a program using the package
# sees nothing unless it configures logging (the homagg command does).
logging.getLogger("homagg").addHandler(logging.NullHandler())
