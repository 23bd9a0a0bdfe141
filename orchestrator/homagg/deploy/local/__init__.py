"""A local testbed: one network namespace per host, a bridge as the switch.

- ``homagg.deploy.local.testbed``: ``Testbed.up`` / ``down``, hosts,
  addresses, link rates, ``run_in`` (a process in a host's namespace).
  Start here.
- ``homagg.deploy.local.placement``: a run on a testbed (``homagg run
  --testbed``: homagg.runs.allreduce over TestbedPlacement).
- ``homagg.deploy.local.testbed_job``: the daemons and the job a testbed
  keeps for torchrun and ``homagg train`` (``homagg testbed up``).

The command line is homagg.cli.testbed (``homagg testbed``).
"""
