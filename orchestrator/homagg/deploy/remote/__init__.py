"""Real hosts from an inventory (``testbed.toml``, docs/INVENTORY.md), over SSH.

- ``homagg.deploy.remote.inventory``: the inventory loaded and validated
  (``load``, ``Inventory``, ``HostSpec``).  Start here.
- ``homagg.deploy.remote.ssh``: one host's SSH session (fabric), preflight,
  steps run in parallel over hosts.
- ``homagg.deploy.remote.provision``: ``homagg provision`` (packages, venv,
  HomAgg, hugepages, NIC), with ``progress`` its live per-host view.
- ``homagg.deploy.remote.ansible_inventory``: ``homagg ansible-inventory``
  (the same inventory for ansible/site.yml).
- ``homagg.deploy.remote.hosts``: the provisioned hosts: start and stop the
  daemons (``homagg up``, ``homagg down``; ``up`` and ``down`` are their
  subcommand modules).
- ``homagg.deploy.remote.placement``: a run on those hosts (``homagg run
  -i``: homagg.runs.allreduce over InventoryPlacement).
"""
