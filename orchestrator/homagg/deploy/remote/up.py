"""Start homagg-switch on every aggregator host of the inventory over SSH (in the background).

    homagg up -i testbed.toml [--no-udp-csum] [--switch PATH] [--auth] [--leaves L]

Checks every host first (login, privilege, provisioned venv and config, the
daemon binary, the data-plane device); starts one daemon per aggregator
host with that host's PCI NIC or vdev, cores and data-plane IP from the
inventory, writes its PID file and waits until its control socket answers.
Then it registers one job for every worker host, spread over every
aggregator (--slots, --payload-bytes, --timeout), and writes its job file
on every host, INSTALL_DIR/run/job.json (HOMAGG_JOB_FILE of homagg.torch,
for torchrun on the worker hosts; a worker's names its own bind address).
With --leaves L the job is a two-level tree: the first L aggregator hosts
are leaves, each below the last one, the root, and each worker's job file
names its leaf; with --auth too, each leaf gets a secret of its own.
`homagg run allreduce -i` registers a job of its own (a tree of L leaves
by default after --leaves L); `homagg train -i` trains on this job when it
is the run's, else on one of its own;
`homagg down -i testbed.toml` removes the job and stops the daemons;
`homagg rotate-key -i testbed.toml` gives a job started with --auth a new
secret while it runs.
Details: homagg.deploy.remote.hosts.
"""


def add_arguments(p):
    from homagg.deploy.remote.hosts import add_up_arguments

    add_up_arguments(p)


def main(args) -> int:
    from homagg.deploy.remote.hosts import up_main

    return up_main(args)
