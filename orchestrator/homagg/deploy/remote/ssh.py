"""SSH to the hosts of an inventory (fabric), shared by ``homagg provision``
and ``homagg up / run -i / down``.

- ``Session``: the connection to one host (``connect``, ``run`` as root
  with ``sudo -n`` when the login user is not root, ``put_text``, and
  ``preflight``: log in, check the privilege and the OS, each failure a
  ``StepFailed`` naming the fix).
- ``parallel(fn, sessions, workers)``: ``fn`` on every host at once, a
  result (or the exception) per host; ``run_all(sessions, cmd)``: one
  unchanged command on every host through ``fabric.ThreadingGroup``.
- ``preflight_all``: the preflight of every host; one ``PreflightError``
  naming every failing host and its fix, so one bad host never hides
  another.
- ``StepResult`` / ``format_table`` / ``failure_message``: the per-host,
  per-step report.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import logging
import os
import shlex
import socket

from homagg.deploy.remote import inventory as inv

# ProvisionError, PreflightError, StepFailed: defined in homagg.errors, importable from here too
from homagg.errors import ProvisionError, PreflightError, StepFailed  # noqa: F401

log = logging.getLogger("homagg.deploy.remote.ssh")

CHANGED, OK, FAILED, WOULD, SKIPPED = "changed", "ok", "failed", "would change", "skipped"
TAIL_LINES = 15


@dataclasses.dataclass
class StepResult:
    step: str
    status: str  # changed | ok | failed | would change | skipped
    detail: str = ""
    stderr: str = ""


def tail(text: str, n: int = TAIL_LINES) -> str:
    return "\n".join((text or "").rstrip().splitlines()[-n:])


_OS_RELEASE = '. /etc/os-release && printf \'%s\\n%s\\n%s\\n\' "$ID" "$ID_LIKE" "$PRETTY_NAME"'


class Session:
    """The SSH connection to one host of an inventory."""

    def __init__(self, h: inv.HostSpec, inventory: inv.Inventory):
        self.h = h
        self.inv = inventory
        self.s = inventory.settings
        self.conn = None
        self.sudo = ""

    @property
    def where(self) -> str:
        return f"{self.h.ssh_user}@{self.h.ssh_host}:{self.h.ssh_port}"

    def connect(self):
        """Open the connection; StepFailed naming the fix when it fails."""
        import paramiko
        from fabric import Connection

        self.conn = Connection(
            self.h.ssh_host,
            user=self.h.ssh_user,
            port=self.h.ssh_port,
            connect_timeout=self.s.connect_timeout,
            connect_kwargs={
                "key_filename": [self.h.ssh_key],
                "look_for_keys": False,
                "allow_agent": False,
                "banner_timeout": self.s.connect_timeout,
                "auth_timeout": self.s.connect_timeout,
            },
        )
        where = self.where
        try:
            self.conn.open()
        except paramiko.AuthenticationException as e:
            raise StepFailed(
                f"SSH login as {where} with key {self.h.ssh_key} was refused ({e}): add "
                f"{self.h.ssh_key}.pub to ~{self.h.ssh_user}/.ssh/authorized_keys on the host, "
                "or fix 'ssh_key'/'ssh_user' in the inventory"
            ) from None
        except paramiko.SSHException as e:
            raise StepFailed(
                f"SSH to {where} failed: {e}: check that sshd runs there and "
                "'ssh_key' is a valid private key"
            ) from None
        except (OSError, socket.timeout, EOFError) as e:
            raise StepFailed(
                f"cannot reach {where}: {e}: check 'ssh_host'/'ssh_port' in the inventory, that "
                "the host is up, sshd listens there and no firewall blocks it "
                f"(connect_timeout {self.s.connect_timeout:g}s)"
            ) from None
        log.debug("%s: connected to %s", self.h.name, where)

    def close(self):
        if self.conn is not None:
            self.conn.close()

    def run(
        self, cmd: str, check: bool = True, timeout: float | None = None, stdin: str | None = None
    ):
        """Run ``cmd`` with sh as root (sudo -n when the login user is not
        root); StepFailed with the stderr tail when it fails and ``check``.
        ``stdin``: text the command reads on its standard input (how a
        secret reaches a remote command: never in ``cmd``, which is logged)."""
        full = f"{self.sudo}sh -c {shlex.quote(cmd)}"
        log.debug("%s: %s", self.h.name, cmd if len(cmd) < 200 else cmd[:197] + "...")
        if stdin is None:
            r = self.conn.run(
                full,
                hide=True,
                warn=True,
                in_stream=False,
                timeout=timeout or self.s.command_timeout,
            )
        else:
            from invoke.exceptions import ThreadException

            try:
                r = self.conn.run(
                    full,
                    hide=True,
                    warn=True,
                    in_stream=io.StringIO(stdin),
                    timeout=timeout or self.s.command_timeout,
                )
            except (ThreadException, OSError) as e:
                # the command ended before it read its input (never quoted here)
                short = cmd if len(cmd) < 120 else cmd[:117] + "..."
                raise StepFailed(
                    f"`{short}` on {self.h.name} did not read its input: {type(e).__name__}"
                ) from None
        if check and r.exited != 0:
            raise StepFailed(
                f"`{cmd if len(cmd) < 120 else cmd[:117] + '...'}` exited {r.exited}",
                tail(r.stderr or r.stdout),
            )
        return r

    def put_text(self, text: str, remote: str, mode: str = "0644"):
        """``text`` into file ``remote`` with ``mode``, owned by the user
        commands run as (root): by SFTP into a new private temporary file
        of the login user (mktemp's 0600: SFTP writes as that user, also
        when commands run with sudo), then installed as root; the text is
        never on a command line, so a secret may go this way."""
        r = self.conn.run(
            "mktemp", hide=True, warn=True, in_stream=False, timeout=self.s.command_timeout
        )
        if r.exited != 0 or not r.stdout.strip():
            raise StepFailed(f"`mktemp` failed on {self.where}", tail(r.stderr))
        tmp = r.stdout.strip()
        try:
            self.conn.put(io.BytesIO(text.encode()), tmp)
            self.run(
                f"mkdir -p {shlex.quote(os.path.dirname(remote))} && "
                f"(umask 077 && install -m {mode} {shlex.quote(tmp)} {shlex.quote(remote)})"
            )
        finally:
            self.conn.run(
                f"rm -f {shlex.quote(tmp)}",
                hide=True,
                warn=True,
                in_stream=False,
                timeout=self.s.command_timeout,
            )

    # -- preflight: login, privilege, OS --------------------------------------

    def privilege(self, uid_result) -> None:
        """From the result of ``id -u``: root, or passwordless sudo (then every
        later command runs with sudo -n).  StepFailed with the fix."""
        if uid_result.exited != 0:
            raise StepFailed(f"`id -u` failed on {self.where}", tail(uid_result.stderr))
        if uid_result.stdout.strip() == "0":
            return
        r = self.conn.run(
            "sudo -n true", hide=True, warn=True, in_stream=False, timeout=self.s.connect_timeout
        )
        if r.exited != 0:
            raise StepFailed(
                f"user {self.h.ssh_user} on {self.h.name} is not root and has no passwordless "
                f"sudo: log in as root (ssh_user = 'root') or add "
                f"'{self.h.ssh_user} ALL=(ALL) NOPASSWD: ALL' to /etc/sudoers.d/homagg",
                tail(r.stderr),
            )
        self.sudo = "sudo -n "

    def os_name(self, r=None) -> str:
        """The OS's pretty name from /etc/os-release (r: its result, if
        already read); StepFailed unless Debian or Ubuntu."""
        if r is None:
            r = self.conn.run(
                _OS_RELEASE, hide=True, warn=True, in_stream=False, timeout=self.s.command_timeout
            )
        if r.exited != 0:
            raise StepFailed(f"{self.h.name}: cannot read /etc/os-release", tail(r.stderr))
        ident, like, pretty = (r.stdout.splitlines() + ["", "", ""])[:3]
        if "debian" not in (ident, *like.split()) and "ubuntu" not in (ident, *like.split()):
            raise StepFailed(
                f"{self.h.name} runs {pretty or ident!r}: HomAgg provisioning supports "
                "Debian and Ubuntu (apt); use a Debian 12 or Ubuntu 22.04+ host"
            )
        return pretty

    def preflight(self) -> str:
        """Log in, check privilege and OS; the OS's name.  StepFailed with the fix."""
        self.connect()
        self.privilege(
            self.conn.run(
                "id -u", hide=True, warn=True, in_stream=False, timeout=self.s.connect_timeout
            )
        )
        return self.os_name()


# --------------------------------------------------------------------------
# Many hosts


def parallel(fn, sessions, workers):
    """{host name: fn(session)} with fn run on every session at once (at most
    ``workers`` threads); an exception fn raises is re-raised here."""
    if not sessions:
        return {}
    with concurrent.futures.ThreadPoolExecutor(
        max_workers=max(1, min(workers, len(sessions)))
    ) as ex:
        futs = {s.h.name: ex.submit(fn, s) for s in sessions}
        return {name: f.result() for name, f in futs.items()}


def run_all(sessions, cmd: str, timeout: float):
    """One unchanged command on every (connected) session's host at once, by
    fabric.ThreadingGroup, without sudo; {host name: Result, or the
    exception the connection raised}."""
    from fabric import ThreadingGroup
    from fabric.exceptions import GroupException

    if not sessions:
        return {}
    by_conn = {id(s.conn): s.h.name for s in sessions}
    group = ThreadingGroup.from_connections([s.conn for s in sessions])
    try:
        results = group.run(cmd, hide=True, warn=True, in_stream=False, timeout=timeout)
    except GroupException as e:
        results = e.result
    return {by_conn[id(c)]: r for c, r in results.items()}


def preflight_all(
    sessions: list, parallel_hosts: int, out, consequence: str, check=None, table=None
) -> dict[str, StepResult]:
    """The preflight of every host: connect all in parallel, then ``id -u``
    and /etc/os-release on all at once (run_all), then ``check(session)``
    (extra checks of the caller, may be None; StepFailed names the fix) in
    parallel.  If any host
    fails, print the table and raise PreflightError naming each failing
    host and its fix (``consequence`` says what did not happen, e.g.
    "nothing was changed").  ``table`` formats the report (format_table)."""
    res: dict[str, StepResult] = {}

    def fail(name, e):
        if isinstance(e, StepFailed):
            res[name] = StepResult("preflight", FAILED, e.detail, e.stderr)
        else:
            res[name] = StepResult("preflight", FAILED, f"{type(e).__name__}: {e}")

    def guarded(fn):
        def one(s):
            try:
                return fn(s)
            except Exception as e:  # noqa: BLE001 - one result per host
                return e

        return one

    def alive():
        return [s for s in sessions if s.h.name not in res]

    for name, v in parallel(guarded(lambda s: s.connect()), sessions, parallel_hosts).items():
        if isinstance(v, Exception):
            fail(name, v)
    by_name = {s.h.name: s for s in sessions}
    for name, r in run_all(
        alive(), "id -u", sessions[0].s.connect_timeout if sessions else 0
    ).items():
        try:
            if isinstance(r, Exception):
                raise r
            by_name[name].privilege(r)
        except Exception as e:  # noqa: BLE001
            fail(name, e)
    pretty = {}
    for name, r in run_all(
        alive(), _OS_RELEASE, sessions[0].s.command_timeout if sessions else 0
    ).items():
        try:
            if isinstance(r, Exception):
                raise r
            pretty[name] = by_name[name].os_name(r)
        except Exception as e:  # noqa: BLE001
            fail(name, e)
    if check is not None:
        for name, v in parallel(guarded(check), alive(), parallel_hosts).items():
            if isinstance(v, Exception):
                fail(name, v)
    for name, p in pretty.items():
        res.setdefault(name, StepResult("preflight", OK, p))
    pres = {s.h.name: res[s.h.name] for s in sessions}
    bad = [(n, r) for n, r in pres.items() if r.status == FAILED]
    if bad:
        reports = {n: [r] for n, r in pres.items()}
        print((table or format_table)(reports), file=out)
        failures = [(n, "preflight", r.detail, r.stderr) for n, r in bad]
        raise PreflightError(
            failure_message(f"preflight failed, {consequence}", failures), failures, reports
        )
    return pres


def failure_message(head, failures):
    parts = [f"{head} on {len(failures)} host(s):"]
    for host, step, detail, stderr in failures:
        parts.append(f"  host '{host}': step '{step}': {detail}")
        for ln in (stderr or "").splitlines():
            parts.append(f"      | {ln}")
    return "\n".join(parts)


def format_table(reports: dict[str, list[StepResult]]) -> str:
    rows = [("HOST", "STEP", "STATUS", "DETAIL")]
    for host, steps in reports.items():
        for s in steps:
            rows.append((host, s.step, s.status, s.detail))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]}" for r in rows]
    summary = []
    for host, steps in reports.items():
        counts = {
            st: sum(1 for s in steps if s.status == st) for st in (CHANGED, OK, WOULD, FAILED)
        }
        summary.append(
            f"{host}: changed={counts[CHANGED]} ok={counts[OK]} "
            + (f"would_change={counts[WOULD]} " if counts[WOULD] else "")
            + f"failed={counts[FAILED]}"
        )
    return "\n".join(lines + [""] + summary)
