"""Job secrets and keys of authenticated jobs (docs/PROTOCOL.md Part 2,
"Authentication"; the C side is homagg/auth.h, on libsodium).

A job with authentication has a 32-byte secret.  The aggregator gets it
over its control socket (``ControlClient.add_job(..., auth=secret)``), the
workers from a file only its owner may read::

    from homagg import auth

    secret = auth.create_secret_file("/run/user/0/job7.secret")  # mode 0600
    secret = auth.load_secret("/run/user/0/job7.secret")
    Worker(..., auth_file="/run/user/0/job7.secret")

The file holds the secret as 64 hexadecimal digits on one line.  The
secret never goes on a command line or into a log line: pass the file's
path, not its content.
"""

import os
import stat

from homagg.bindings import auth as _b
from homagg.errors import InvalidArgument, SecretFileError

SECRET_LEN = _b.SECRET_LEN
KEY_LEN = _b.KEY_LEN
MAC_LEN = _b.MAC_LEN
AGGREGATOR = _b.KEY_AGGREGATOR
MAC_BLAKE2B = _b.MAC_BLAKE2B
MAC_AES_GMAC = _b.MAC_AES_GMAC
MAC_UMAC = _b.MAC_UMAC
MAC_NAMES = {MAC_BLAKE2B: "blake2b", MAC_AES_GMAC: "aes-gmac", MAC_UMAC: "umac"}
DIR_REQUEST = _b.DIR_REQUEST
DIR_REPLY = _b.DIR_REPLY
# AES-GMAC's ISA paths, which also pick UMAC's NH form (HOMAGG_MAC_ISA;
# the same tag bytes on each).
MAC_ISAS = _b.MAC_ISAS
mac_isa = _b.mac_isa
mac_isa_available = _b.mac_isa_available


def new_secret():
    """32 random bytes from the OS."""
    return os.urandom(SECRET_LEN)


def _check_secret(secret):
    return _b.fixed_bytes(secret, SECRET_LEN, "a job secret")


def create_secret_file(path, secret=None):
    """Write ``secret`` (default: a new random one) to a new file ``path``
    readable and writable by its owner only; returns the secret.  An
    existing file is never overwritten."""
    secret = _check_secret(new_secret() if secret is None else secret)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, secret.hex().encode() + b"\n")
    finally:
        os.close(fd)
    return secret


def load_secret(path):
    """The secret in file ``path``.  Refuses a file that its group or other
    users may read or write, one owned by another user, and anything but 64
    hex digits, with a message naming the file and the fix."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise SecretFileError(f"secret file {path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecretFileError(f"secret file {path}: not a regular file")
        if st.st_mode & 0o077:
            raise SecretFileError(
                f"secret file {path} is accessible by its group or others "
                f"(mode {stat.S_IMODE(st.st_mode):04o}): run `chmod 600 {path}`"
            )
        if st.st_uid != os.geteuid():
            raise SecretFileError(
                f"secret file {path} belongs to uid {st.st_uid}, not to this "
                f"user (uid {os.geteuid()}): it must be the reader's own file"
            )
        text = os.read(fd, 4 * SECRET_LEN + 16)
    finally:
        os.close(fd)
    try:
        secret = bytes.fromhex(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        secret = b""
    if len(secret) != SECRET_LEN:
        raise SecretFileError(
            f"secret file {path}: must hold {2 * SECRET_LEN} hexadecimal digits "
            "(homagg.auth.create_secret_file writes one)"
        )
    return secret


def derive_key(secret, job, key_id):
    """The key ``key_id`` (a worker id, or AGGREGATOR) of job ``job`` (its
    id) under a job secret."""
    return _b.derive_key(secret, job, key_id)


def mac_name(alg):
    """'umac', 'aes-gmac' or 'blake2b' for an algorithm code."""
    return MAC_NAMES[alg]


def mac_code(name):
    """The algorithm code of a MAC name ('umac', 'aes-gmac', 'blake2b'), or of
    'auto' (this host's default); a one-line error naming the choices."""
    if name in (None, "auto"):
        return _b.default_mac()
    for code, n in MAC_NAMES.items():
        if n == name:
            if not _b.mac_available(code):
                lacks = "AES-NI" if code == MAC_UMAC else "AES-NI or PCLMULQDQ"
                raise InvalidArgument(f"mac {name}: this host's CPU lacks {lacks}; use mac blake2b")
            return code
    raise InvalidArgument(f"mac {name!r}: one of {', '.join(MAC_NAMES.values())} or auto")


def mac_available(code):
    """Can this host compute MAC algorithm ``code``?"""
    return _b.mac_available(code)


def default_mac_name():
    """This host's default MAC algorithm's name."""
    return MAC_NAMES[_b.default_mac()]


def mac(key, data, alg=None, direction=0, counter=1):
    """The 16-byte MAC of ``data`` (a HomAgg header and payload) under
    ``key`` with algorithm ``alg`` (default: this host's)."""
    return _b.mac(_b.default_mac() if alg is None else alg, key, direction, counter, data)
