"""The live per-host, per-step view of long operations (homagg.deploy.remote.progress) and
the logging setup of the homagg command (homagg.log)."""

import io
import logging
import threading

from rich.console import Console

from homagg import log as hlog
from homagg.deploy.remote.progress import StepView
from homagg.deploy.remote.ssh import FAILED, OK, StepResult


def test_log_lines_when_not_a_terminal(caplog):
    caplog.set_level(logging.INFO, logger="homagg")
    with StepView(["a", "b"], ("os", "packages"), live=False) as v:
        v.start("a", "os")
        v.done("a", StepResult("os", OK, "Debian 12"))
        v.start("b", "os")
        v.done("b", StepResult("os", FAILED, "no apt"))
    msgs = [r.getMessage() for r in caplog.records if r.name == "homagg.deploy.remote.progress"]
    assert msgs[0] == "a: os ..."
    assert msgs[1].startswith("a: os ok (") and msgs[1].endswith("): Debian 12")
    assert msgs[3].startswith("b: os failed (") and "no apt" in msgs[3]


def test_live_table_follows_the_steps_of_every_host():
    v = StepView(["h1", "h2"], ("os", "packages", "venv"), title="t", live=True)
    buf = io.StringIO()
    v._live.console = Console(file=buf, width=120, force_terminal=False)
    with v:
        threads = []
        for h in ("h1", "h2"):

            def work(h=h):
                for step in ("os", "packages"):
                    v.start(h, step)
                    v.done(h, StepResult(step, OK, f"{h} {step} done"))
                v.start(h, "venv")

            threads.append(threading.Thread(target=work))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        state = dict(v._state)
    assert state["h1"]["done"] == 2 and state["h1"]["step"] == "venv"
    assert state["h2"]["last"] == "packages ok: h2 packages done"
    out = buf.getvalue()
    assert "h1" in out and "2/3" in out and "venv" in out


def test_setup_levels():
    logger = logging.getLogger("homagg")
    before = logger.level, list(logger.handlers)
    try:
        assert hlog.setup(-1).level == logging.WARNING
        assert hlog.setup(1).level == logging.DEBUG
        hlog.setup(0)
        ours = [h for h in logger.handlers if getattr(h, "_homagg", False)]
        assert logger.level == logging.INFO and len(ours) == 1
    finally:
        logger.setLevel(before[0])
        logger.handlers[:] = before[1]
