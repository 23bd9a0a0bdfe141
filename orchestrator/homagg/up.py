"""Start homagg-switch on every aggregator host of the inventory over SSH (in the background).

    homagg up -i testbed.toml [--no-udp-csum] [--switch PATH]

Checks every host first (login, privilege, provisioned venv and config, the
daemon binary, the data-plane device); starts one daemon per aggregator
host with that host's PCI NIC or vdev, cores and data-plane IP from the
inventory, writes its PID file and waits until its control socket answers.  No job is
registered: `homagg run allreduce -i testbed.toml ...` does that, `homagg
down -i testbed.toml` stops it.  Details: homagg.remote.
"""


def add_arguments(p):
    from homagg.remote import add_up_arguments

    add_up_arguments(p)


def main(args) -> int:
    from homagg.remote import up_main

    return up_main(args)
