"""A live per-host, per-step view of a long operation on many hosts.

``StepView(hosts, steps)`` is a context manager; the code doing the work
calls ``start(host, step)`` when a step begins and ``done(host, result)``
(a ``homagg.deploy.remote.ssh.StepResult``) when it ends, from any thread.  On a terminal
it shows a table (``rich``: one row per host with its current step, how
many of the steps are done and the last result) refreshed as the steps
move; elsewhere (a log file, CI) every start and end is one line on the
``homagg.deploy.remote.progress`` logger, so a step that runs for half an hour is never
silent.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

log = logging.getLogger("homagg.deploy.remote.progress")


class StepView:
    def __init__(
        self,
        hosts: list[str],
        steps: tuple[str, ...] | list[str],
        title: str = "",
        live: bool | None = None,
    ):
        self.hosts = list(hosts)
        self.steps = list(steps)
        self.title = title
        self._lock = threading.Lock()
        self._state = {
            h: {"step": "waiting", "since": time.monotonic(), "done": 0, "last": ""}
            for h in self.hosts
        }
        if live is None:
            live = sys.stderr.isatty()
        self._live = None
        if live:
            try:
                from rich.console import Console
                from rich.live import Live
            except ImportError:  # the provision extra is not installed: log lines
                pass
            else:
                self._live = Live(
                    self._render(),
                    console=Console(stderr=True),
                    refresh_per_second=4,
                    transient=False,
                )

    def __enter__(self):
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, *exc):
        if self._live is not None:
            self._live.update(self._render())
            self._live.stop()
        return False

    def _render(self):
        from rich.table import Table

        t = Table(title=self.title or None)
        for col in ("host", "step", "done", "running for", "last result"):
            t.add_column(col)
        now = time.monotonic()
        for h in self.hosts:
            st = self._state[h]
            t.add_row(
                h,
                st["step"],
                f"{st['done']}/{len(self.steps)}",
                f"{now - st['since']:.0f} s",
                st["last"],
            )
        return t

    def _refresh(self):
        if self._live is not None:
            self._live.update(self._render())

    def start(self, host: str, step: str) -> None:
        with self._lock:
            self._state[host].update(step=step, since=time.monotonic())
            self._refresh()
        log.info("%s: %s ...", host, step)

    def done(self, host: str, result) -> None:
        with self._lock:
            st = self._state[host]
            took = time.monotonic() - st["since"]
            st["done"] += 1
            st["last"] = f"{result.step} {result.status}" + (
                f": {result.detail}"[:60] if result.detail else ""
            )
            st["step"] = "finished" if st["done"] >= len(self.steps) else "-"
            self._refresh()
        log.info(
            "%s: %s %s (%.1f s)%s",
            host,
            result.step,
            result.status,
            took,
            f": {result.detail}" if result.detail else "",
        )
