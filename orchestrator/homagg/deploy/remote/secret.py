"""Job secrets on inventory hosts (docs/SECURITY.md "Deploying with
authentication").

A worker reads its job's secret from a file only its owner may read
(homagg.auth.load_secret).  On inventory hosts that file gets there over
SSH, never on a command line, in an environment or in a log line:

- the inventory's ``auth_secret`` (a file on this machine; created here,
  mode 0600, when missing) is what ``homagg provision`` (step ``secret``)
  and the Ansible playbook copy to every worker host as
  ``HostSpec.secret_file``; ``homagg up -i --auth`` registers that secret
  on the aggregators (over their control sockets, the request on stdin)
  and names the file in the job file;
- without ``auth_secret``, ``homagg up -i --auth`` makes a new secret and
  puts it into the run directory of every worker host (removed by
  ``homagg down``), and ``homagg run allreduce -i --auth`` a new one per
  run into that run's folder (homagg.deploy.remote.placement).

The file holds the secret as 64 hex digits and a newline, as
homagg.auth.create_secret_file writes it; a host's copy is compared by its
SHA-256, so the secret itself never travels back.
"""

from __future__ import annotations

import hashlib
import os
import shlex

from homagg import auth as hg_auth
from homagg.errors import RemoteError


def file_text(secret: bytes) -> str:
    """The content of a secret file holding ``secret``."""
    return bytes(secret).hex() + "\n"


def local_secret(inventory, create: bool = True) -> bytes:
    """The secret in the inventory's ``auth_secret`` file; a missing file is
    created first (a new secret, mode 0600) when ``create``."""
    path = inventory.settings.auth_secret
    if not path:
        raise RemoteError(f"inventory {inventory.path}: no 'auth_secret' in [settings]")
    if create and not os.path.exists(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return hg_auth.create_secret_file(path)
    return hg_auth.load_secret(path)


def host_state(session, path: str, secret: bytes) -> str:
    """ "ok" when ``path`` on the session's host holds ``secret`` with mode
    0600 and belongs to the user commands run as; else what is wrong, with
    the fix left to the caller."""
    q = shlex.quote(path)
    r = session.run(f"stat -c '%a %u' {q} && id -u && sha256sum {q}", check=False)
    if r.exited != 0:
        return f"{path} is missing"
    lines = r.stdout.split("\n")
    mode, uid = lines[0].split()
    me = lines[1].strip()
    digest = lines[2].split()[0] if len(lines) > 2 and lines[2] else ""
    if digest != hashlib.sha256(file_text(secret).encode()).hexdigest():
        return f"{path} holds another secret"
    if mode != "600":
        return f"{path} has mode {mode}, not 600"
    if uid != me:
        return f"{path} belongs to uid {uid}, not {me}"
    return "ok"


def put(session, path: str, secret: bytes) -> None:
    """``secret`` into ``path`` on the session's host, mode 0600 in a folder
    of mode 0700 (by SFTP, homagg.deploy.remote.ssh.Session.put_text)."""
    session.put_text(file_text(secret), path, mode="0600")
    session.run(f"chmod 700 {shlex.quote(os.path.dirname(path))}")
