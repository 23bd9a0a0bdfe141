"""Where HomAgg runs: the machines, networks and processes of a deployment.

- ``homagg.deploy.local``: a testbed on this machine (network namespaces,
  veth, a bridge as the switch), with its daemons and its job.
- ``homagg.deploy.remote``: real hosts named in an inventory
  (``testbed.toml``), reached over SSH: provisioning, the Ansible inventory,
  ``homagg up`` / ``down`` and the runs on them.
- ``homagg.deploy.rotate``: a new secret for the running job of either
  (``homagg rotate-key``).
- ``homagg.deploy.placement``: what a run needs of either (start a process
  on a host, its barrier and output, fetch a file, stop it), implemented by
  ``local.placement.TestbedPlacement`` and
  ``remote.placement.InventoryPlacement``; homagg.runs.allreduce runs above it.
"""
