"""Client of homagg-switch's control socket (JSON lines over a UNIX socket).

    with ControlClient("/run/homagg-switch.sock", timeout=2.0) as ctl:
        ctl.add_job(job=7, token=99, workers=4, slots=64, payload=1024,
                    group="239.1.1.1")
        print(ctl.stats()["stats"]["results_sent"])
        ctl.remove_job(7)

Every request gets one reply line: ``{"ok": true, ...}`` is returned as a
dict, ``{"ok": false, "error": ...}`` raises the matching homagg.errors
exception (the daemon's message names the offending field).  docs/SWITCH.md
lists the requests.
"""

import errno
import json
import socket
import time

from homagg.errors import (
    HomAggError,
    InvalidArgument,
    OutOfRange,
    PeerTimeout,
    ProtocolError,
)
from homagg.errors import ControlError


_BY_ERRNO = {
    errno.EINVAL: InvalidArgument,
    errno.ERANGE: OutOfRange,
    errno.EPROTO: ProtocolError,
}


def _error_for(reply):
    """The exception for an error reply: by its errno code, else ControlError
    (job exists, no such job, engine refused)."""
    message = str(reply.get("error", "request failed"))
    code = reply.get("code", 0)
    code = code if isinstance(code, int) else 0
    cls = _BY_ERRNO.get(-code, ControlError)
    return cls(f"homagg-switch: {message}", code)


class ControlClient:
    """One connection to the daemon; requests are answered in order."""

    def __init__(self, path, timeout=5.0):
        self.path = str(path)
        self.timeout = timeout
        self._sock = None
        self._buf = b""

    def connect(self):
        if self._sock is None:
            deadline = time.monotonic() + self.timeout
            while True:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(self.timeout)
                try:
                    s.connect(self.path)
                    break
                except BlockingIOError as exc:
                    # the listen backlog is full: the daemon accepts
                    # every millisecond, so try again until the timeout
                    s.close()
                    if time.monotonic() > deadline:
                        raise PeerTimeout(
                            f"homagg-switch control socket {self.path}: backlog full"
                        ) from exc
                    time.sleep(0.001)
                except (FileNotFoundError, ConnectionRefusedError) as exc:
                    s.close()
                    raise PeerTimeout(f"homagg-switch control socket {self.path}: {exc}") from exc
                except socket.timeout as exc:
                    s.close()
                    raise PeerTimeout(
                        f"homagg-switch control socket {self.path}: connect timed out"
                    ) from exc
            self._sock = s
            self._buf = b""
        return self

    def close(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self):
        return self.connect()

    def __exit__(self, *exc):
        self.close()

    def send_line(self, line):
        """Send one raw request line (bytes or str); return the reply dict
        without checking "ok" (tests use it for malformed requests)."""
        if isinstance(line, str):
            line = line.encode()
        self.connect()
        try:
            self._sock.sendall(line.rstrip(b"\n") + b"\n")
            return self._read_reply()
        except socket.timeout as exc:
            self.close()
            raise PeerTimeout(
                f"homagg-switch at {self.path}: no reply within {self.timeout} s"
            ) from exc
        except OSError as exc:
            self.close()
            raise ProtocolError(f"homagg-switch at {self.path}: {exc}") from exc

    def _read_reply(self):
        deadline = time.monotonic() + self.timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout()
            self._sock.settimeout(left)
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ProtocolError(f"homagg-switch at {self.path} closed the connection")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError as exc:
            raise ProtocolError(f"homagg-switch sent a bad reply: {line[:200]!r}") from exc
        if not isinstance(reply, dict) or "ok" not in reply:
            raise ProtocolError(f"homagg-switch sent a bad reply: {line[:200]!r}")
        return reply

    def request(self, cmd, **fields):
        """Send {"cmd": cmd, **fields}; return the reply or raise."""
        reply = self.send_line(json.dumps({"cmd": cmd, **fields}))
        if not reply["ok"]:
            raise _error_for(reply)
        return reply

    def add_job(
        self,
        job,
        token,
        workers,
        slots,
        payload=1024,
        group=None,
        shard=None,
        incarnation=None,
        auth=None,
        parent=None,
        mac=None,
    ):
        """Configure a job; the reply carries the job's ``incarnation``
        (chosen by the daemon from its clock unless given).  ``auth``: the
        job secret (32 bytes) of an authenticated job; it travels over the
        control socket only (the daemon logs no request); ``mac`` its MAC
        algorithm, "umac", "aes-gmac" or "blake2b" (None: the daemon host's
        default; every worker must be given the same).  ``parent``: this
        daemon is a tree leaf below that root, a dict with ``ip``, ``mac``,
        ``worker`` (the leaf's id at the root) and optionally ``port``,
        ``shard``, ``group``, ``rto_us`` (docs/PROTOCOL.md "Tree")."""
        fields = dict(job=job, token=token, workers=workers, slots=slots, payload=payload)
        if group is not None:
            fields["group"] = group
        if shard is not None:
            fields["shard"] = shard
        if incarnation is not None:
            fields["incarnation"] = incarnation
        if auth is not None:
            fields["auth"] = bytes(auth).hex()
        if mac is not None:
            fields["mac"] = mac
        if parent is not None:
            fields["parent"] = dict(parent)
        return self.request("add_job", **fields)

    def remove_job(self, job):
        return self.request("remove_job", job=job)

    def rotate_key(self, job, secret, grace=10.0):
        """Register the next key epoch of authenticated job ``job`` with
        ``secret`` (32 bytes); frames of the previous epoch are accepted for
        ``grace`` seconds more (docs/PROTOCOL.md "Key epochs").  The reply
        carries the new ``epoch``."""
        return self.request(
            "rotate_key", job=job, auth=bytes(secret).hex(), grace_ms=int(grace * 1000)
        )

    def rotate_up_key(self, job, key, reply_key):
        """Tree leaf ``job``: its keys of the root's next key epoch (its own
        key at the root, the root's aggregator key; 32 bytes each), given
        before the root rotates (docs/PROTOCOL.md "Key epochs in a tree").
        The reply carries the next ``up_epoch``."""
        return self.request(
            "rotate_key",
            job=job,
            parent={"key": bytes(key).hex(), "reply_key": bytes(reply_key).hex()},
        )

    def stats(self):
        """{"stats": {counter: value}, "port": {counter: value}}"""
        reply = self.request("stats")
        reply.pop("ok", None)
        return reply

    def job_stats(self, job):
        """One job: "counters" (the engine counters of the job), "worker_counters"
        ({name: [value per worker]}), "workers", "slots", "payload",
        "incarnation", "shard", "sets_open" (docs/SWITCH.md)."""
        reply = self.request("job_stats", job=job)
        reply.pop("ok", None)
        return reply

    def shutdown(self):
        return self.request("shutdown")


def _main(argv=None):
    """``python -m homagg.switch.control [--wait S] [--pid PID] SOCKET REQUEST``:
    send one request (a JSON object) and print the reply line.  REQUEST
    ``-`` reads the request from the first line of stdin: a request with a
    secret (``auth``, ``parent.key``) goes that way, never on a command
    line.  ``--wait``
    retries the connection for S seconds (the daemon is starting), giving up
    early when process PID has exited.  Exit status: 0 ok, 1 the daemon
    refused the request, 2 no daemon answered.  homagg.deploy.remote.hosts runs this on
    the aggregator host over SSH."""
    import argparse
    import os
    import sys

    ap = argparse.ArgumentParser(prog="python -m homagg.switch.control")
    ap.add_argument("--wait", type=float, default=0.0, metavar="S")
    ap.add_argument("--pid", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("socket")
    ap.add_argument("request")
    a = ap.parse_args(argv)
    if a.request == "-":
        a.request = sys.stdin.readline().strip()
    deadline = time.monotonic() + a.wait
    while True:
        try:
            with ControlClient(a.socket, timeout=a.timeout) as c:
                reply = c.send_line(a.request)
            print(json.dumps(reply))
            return 0 if reply.get("ok") else 1
        except PeerTimeout as exc:
            alive = not a.pid or os.path.exists(f"/proc/{a.pid}")
            if time.monotonic() >= deadline or not alive:
                print(f"{exc}" + ("" if alive else f" (process {a.pid} exited)"), file=sys.stderr)
                return 2
            time.sleep(0.05)
        except HomAggError as exc:
            print(str(exc), file=sys.stderr)
            return 2


if __name__ == "__main__":
    raise SystemExit(_main())
