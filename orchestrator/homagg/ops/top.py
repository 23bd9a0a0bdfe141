"""``homagg top``'s model and view: readings of daemons and their rendering.

``sources`` says where the daemons are (local control sockets, a testbed's
daemons, an inventory's aggregators over SSH); ``Sources.read`` takes one
reading of each (homagg.ops.source; a daemon that does not answer is a
reading with ``up`` False); ``render`` makes a rich table of a reading,
with rates against the previous one.  homagg.cli.top runs the loop.
"""

from __future__ import annotations

import json
import shlex
import time

from homagg.errors import HomAggError
from homagg.ops.source import DaemonSnapshot, drop_reasons, guarded, parse_socket_arg, snapshot


# --------------------------------------------------------------------------
# where the daemons are


class Sources:
    """Every daemon to read: local sockets, or control requests over SSH."""

    def __init__(self):
        self.local: dict = {}  # name -> socket path
        self.remote: list = []  # (homagg.deploy.remote.hosts.Host, "" or why it has no session)
        self._closers = []

    def read(self) -> list[DaemonSnapshot]:
        out = [snapshot(n, p) for n, p in self.local.items()]
        for r, err in self.remote:
            if err:  # no SSH session: shown as down, with the fix
                out.append(
                    DaemonSnapshot(
                        name=r.h.name, path=_remote_socket(r), t=time.monotonic(), error=err
                    )
                )
            else:
                out.append(guarded(r.h.name, _remote_socket(r), _remote_request(r)))
        return out

    def close(self):
        for c in self._closers:
            c()


def _remote_socket(r) -> str:
    from homagg.deploy.remote.hosts import control_socket

    return control_socket(r.h)


def _remote_request(r):
    """request(cmd, **fields) over SSH (python -m homagg.switch.control on the host)."""
    from homagg.deploy.remote.hosts import RemoteError
    from homagg.switch.control import _error_for

    def request(cmd, **fields):
        line = json.dumps({"cmd": cmd, **fields})
        res = r.run(
            f"{shlex.quote(r.python)} -m homagg.switch.control "
            f"{shlex.quote(_remote_socket(r))} {shlex.quote(line)}",
            check=False,
            timeout=30,
        )
        out = res.stdout.strip().splitlines()
        try:
            reply = json.loads(out[-1]) if out else None
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise RemoteError(f"host '{r.h.name}': {(res.stderr or res.stdout).strip()[-300:]}")
        if not reply.get("ok"):
            raise _error_for(reply)
        return reply

    return request


def sources(sockets=(), testbed=None, state_dir=None, inventory=None) -> Sources:
    """The daemons at ``sockets`` ([NAME=]PATH), of local testbed
    ``testbed``, and of the aggregators of inventory file ``inventory``."""
    src = Sources()
    for spec in sockets:
        name, path = parse_socket_arg(spec)
        src.local[name] = path
    if testbed:
        from homagg.deploy.local.testbed import Testbed

        daemons = Testbed.open(testbed, state_dir).state().get("daemons", {})
        if not daemons:
            raise HomAggError(
                f"testbed {testbed} runs no homagg-switch (built with "
                "--no-daemon?): nothing to show"
            )
        for host, rec in daemons.items():
            src.local[f"{testbed}/{host}"] = rec["control"]
    if inventory:
        from homagg.deploy.remote import hosts as remote
        from homagg.deploy.remote import inventory as inv

        from homagg.deploy.remote.ssh import StepFailed

        loaded = inv.load(inventory)
        for h in loaded.aggregators:
            r = remote.Host(h, loaded)
            src._closers.append(r.close)
            try:
                r.preflight()  # login and privilege (sudo when not root)
                src.remote.append((r, ""))
            except StepFailed as e:
                src.remote.append((r, str(e)))
    if not src.local and not src.remote:
        raise HomAggError("no daemon to show: give --socket PATH, --testbed NAME or -i INVENTORY")
    return src


# --------------------------------------------------------------------------
# rendering


def _rate(now, before, dt):
    if before is None or dt <= 0 or now < before:
        return None
    return (now - before) / dt


def _fmt_rate(v):
    return "-" if v is None else f"{v:,.0f}"


def _busy(now: DaemonSnapshot, before: DaemonSnapshot | None) -> list[str]:
    out = []
    for i, (t, b) in enumerate(zip(now.engine_ns, now.engine_busy_ns)):
        t0 = b0 = 0
        if before is not None and i < len(before.engine_ns) and before.engine_ns[i] <= t:
            t0, b0 = before.engine_ns[i], before.engine_busy_ns[i]
        out.append(f"{100.0 * (b - b0) / (t - t0):.0f}%" if t > t0 else "-")
    return out


def render(now: list[DaemonSnapshot], before: list[DaemonSnapshot] | None = None):
    """A rich renderable of the readings ``now`` (rates against ``before``)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    prev = {s.name: s for s in (before or []) if s.up}
    parts = []
    for s in now:
        if not s.up:
            parts.append(Text(f"{s.name}: DOWN ({s.error})", style="bold red"))
            continue
        p = prev.get(s.name)
        dt = s.t - p.t if p else 0.0
        drops = sum(drop_reasons(s.stats).values())
        parts.append(
            Text(
                f"{s.name}: {len(s.jobs)} job{'s' if len(s.jobs) != 1 else ''}, "
                f"{s.engines} engine{'s' if s.engines != 1 else ''} busy "
                f"{' '.join(_busy(s, p)) or '-'}, summed {s.stats.get('summed', 0):,}, "
                f"dropped {drops:,}, rx ring {s.rx_ring}",
                style="bold",
            )
        )
        pjobs = {j.job: j for j in p.jobs} if p else {}
        jt = Table(box=None, pad_edge=False)
        for col in (
            "JOB",
            "W",
            "S",
            "IN USE",
            "INCARNATION",
            "SUMMED/S",
            "RESULTS/S",
            "DROPS/S",
            "SUMMED",
            "DROPPED",
        ):
            jt.add_column(col, justify="left" if col == "JOB" else "right")
        wt = Table(box=None, pad_edge=False)
        for col in ("JOB", "WORKER", "FRAMES/S", "SUMMED", "DUPLICATES", "RETRANS", "DROPPED"):
            wt.add_column(col, justify="left" if col == "JOB" else "right")
        for j in s.jobs:
            pj = pjobs.get(j.job)
            if pj is not None and pj.incarnation != j.incarnation:
                pj = None  # registered afresh: counters restarted
            jd = sum(drop_reasons(j.counters).values())
            pd = sum(drop_reasons(pj.counters).values()) if pj else None
            jt.add_row(
                str(j.job),
                str(j.workers),
                str(j.slots),
                str(j.sets_open),
                str(j.incarnation),
                _fmt_rate(
                    _rate(
                        j.counters.get("summed", 0),
                        pj.counters.get("summed", 0) if pj else None,
                        dt,
                    )
                ),
                _fmt_rate(
                    _rate(
                        j.counters.get("results_sent", 0),
                        pj.counters.get("results_sent", 0) if pj else None,
                        dt,
                    )
                ),
                _fmt_rate(_rate(jd, pd, dt)),
                f"{j.counters.get('summed', 0):,}",
                f"{jd:,}",
            )
            for w in range(j.workers):

                def cnt(name, snap=j, w=w):
                    v = snap.worker_counters.get(name, [])
                    return v[w] if w < len(v) else 0

                frames = cnt("summed") + cnt("duplicates") + cnt("dropped")
                pframes = (
                    cnt("summed", pj) + cnt("duplicates", pj) + cnt("dropped", pj) if pj else None
                )
                wt.add_row(
                    str(j.job),
                    str(w),
                    _fmt_rate(_rate(frames, pframes, dt)),
                    f"{cnt('summed'):,}",
                    f"{cnt('duplicates'):,}",
                    f"{cnt('retransmissions'):,}",
                    f"{cnt('dropped'):,}",
                )
        if s.jobs:
            parts += [jt, wt]
        parts.append(Text(""))
    return Group(*parts)
