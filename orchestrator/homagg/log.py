"""Logging: every module logs to a child of the ``homagg`` logger
(``logging.getLogger("homagg.<module>")``); the package itself installs no
handler (a NullHandler), so a program embedding homagg decides what it sees.

``setup(verbosity)`` is what the ``homagg`` command (and each module run
with ``python -m``) calls: progress lines and warnings on stderr, plain
(``-q``: warnings only; ``-v``: debug, with level and logger names).
"""

import logging
import sys

ROOT = "homagg"


def setup(verbosity: int = 0) -> logging.Logger:
    """Configure the ``homagg`` logger for a command line run (idempotent)."""
    log = logging.getLogger(ROOT)
    level = logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO
    log.setLevel(level)
    if not any(getattr(h, "_homagg", False) for h in log.handlers):
        h = logging.StreamHandler(sys.stderr)
        h._homagg = True
        log.addHandler(h)
    for h in log.handlers:
        if getattr(h, "_homagg", False):
            h.setFormatter(
                logging.Formatter(
                    "%(levelname)s %(name)s: %(message)s" if verbosity > 0 else "%(message)s"
                )
            )
    return log
