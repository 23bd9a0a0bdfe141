"""``--log-format json``: the orchestrator's log as one JSON object per line.

Every record becomes ``{"ts", "level", "logger", "msg"}`` (plus ``"exc"``
with the traceback when there is one), the same keys homagg-switch writes
with its own ``--log-format json`` (docs/OPERATIONS.md), so one log
pipeline reads both.
"""

from __future__ import annotations

import datetime
import json
import logging

from homagg import log as _log


class JsonFormatter(logging.Formatter):
    """One line of JSON per record; ``ts`` is UTC ISO 8601 with microseconds."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        ev = {
            "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            ev["exc"] = self.formatException(record.exc_info)
        return json.dumps(ev, ensure_ascii=False)


def use_json(logger: logging.Logger | None = None) -> None:
    """Switch the handlers ``homagg.log.setup`` installed to JSON lines; the
    daemons this process starts log JSON too (``daemon_args``)."""
    global _json
    _json = True
    lg = logger or logging.getLogger(_log.ROOT)
    for h in lg.handlers:
        if getattr(h, "_homagg", False):
            h.setFormatter(JsonFormatter())


_json = False


def daemon_args() -> list[str]:
    """homagg-switch's ``--log-format`` matching this process's log."""
    return ["--log-format", "json"] if _json else []
