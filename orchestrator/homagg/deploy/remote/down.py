"""Stop every process `homagg up` / `homagg run -i` started on the inventory's hosts.

    homagg down -i testbed.toml

On every aggregator host it first removes the job `homagg up` registered
(its job file names it); then on every host it stops the processes named by the PID files in
INSTALL_DIR/run/ (SIGTERM to the process group, SIGKILL after 10 s; a PID
whose start time differs is left alone) and removes INSTALL_DIR/run/.
"""


def add_arguments(p):
    p.add_argument("-i", "--inventory", required=True, help="testbed.toml (docs/INVENTORY.md)")


def main(args) -> int:
    from homagg.deploy.remote.hosts import down_main

    return down_main(args)
