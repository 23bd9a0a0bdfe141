"""Give the running job of a testbed or of an inventory's hosts a new secret (key rotation).

    homagg rotate-key --testbed NAME [--grace S] [--pickup S]
    homagg rotate-key -i testbed.toml [--grace S] [--pickup S]

For the authenticated job `homagg testbed up --auth` or `homagg up -i
--auth` started, while its workers run (docs/SECURITY.md "Rotating keys"):

1. refuses a job without authentication and a rotation inside the
   grace period of the last one (saying when it may run);
2. makes a new secret here and puts it into a new file, mode 0600, on
   every worker host (job-eN.secret beside the job file; by SFTP on
   inventory hosts), never on a command line, in an environment or a log;
   the tree of `homagg testbed up --leaves L --auth` or `homagg up -i
   --leaves L --auth` gets one per leaf (leaf-L-eN.secret, on the hosts
   of that leaf's workers) and a new root secret that no file holds;
3. rewrites every host's job file with that file and key_epoch N: a
   training process (homagg.torch) reads it before its next bucket and
   verifies replies of both epochs from then on; workers started later
   use the new secret;
4. waits --pickup seconds (default 2, at most half the job's timeout:
   longer than one allreduce of the job), then registers the secret as
   epoch N on every aggregator of the job (control request rotate_key;
   a tree level by level: every leaf the root's next keys, the root its
   secret, every leaf its own); frames of the old epoch are accepted for
   --grace seconds more, then counted as bad_mac;
5. records the rotation: the next one may run after the grace period.

Choose --grace longer than the longest pause of a worker between two
allreduces.  A worker made with a fixed secret file (not from the job
file) must be given the new one with Worker.rotate_key(path, epoch).
"""


def add_arguments(p) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--testbed", metavar="NAME", help="a testbed made with `homagg testbed up --auth`"
    )
    where.add_argument(
        "-i",
        "--inventory",
        metavar="TOML",
        help="real hosts: testbed.toml (docs/INVENTORY.md), after `homagg up -i --auth`",
    )
    p.add_argument("--state-dir", default=None, metavar="DIR", help="testbed state directory")
    p.add_argument(
        "--grace",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds the aggregators still accept frames of the old key epoch "
        "(default: %(default)s); the next rotation may run after them",
    )
    p.add_argument(
        "--pickup",
        type=float,
        default=None,
        metavar="S",
        help="seconds between rewriting the job files and registering the key on the "
        "aggregators: the running workers take it meanwhile (default: 2, at most half "
        "the job's timeout; less than the timeout)",
    )


def main(args) -> int:
    import sys

    from homagg.deploy import rotate
    from homagg.errors import HomAggError

    try:
        rotate.rotate(
            rotate.target(args.testbed, args.inventory, args.state_dir),
            grace=args.grace,
            pickup=args.pickup,
        )
    except HomAggError as e:
        print(f"homagg rotate-key: {e}", file=sys.stderr)
        return 1
    return 0
