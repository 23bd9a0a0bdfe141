"""The aggregator daemon homagg-switch (dataplane_c/dpdk/, docs/SWITCH.md)
as Python drives it:

- ``homagg.switch.daemon``: the daemon process in a local testbed's
  aggregator namespace (``Switch``: found, started on a virtual PMD, waited
  for, stopped by PID; ``find_switch``, ``eal_args``: the EAL arguments of every
  homagg-switch).  Start here.
- ``homagg.switch.control``: the client of its control socket
  (``ControlClient``: add, remove and list jobs, stats), also run on remote
  hosts as ``python -m homagg.switch.control``.
- ``homagg.switch.job_file``: a job registered on its aggregators and the
  job file its workers read (``HOMAGG_JOB_FILE``, homagg.torch).
"""
