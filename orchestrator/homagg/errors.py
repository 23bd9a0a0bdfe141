"""The one exception tree of HomAgg.

Every error raised by the bindings carries ``.code`` (the negative errno the C
library returned, or 0 for errors found in Python) and the C library's
message.  ``check(rc)`` turns a C return code into the right exception.
"""

import errno as _errno


class HomAggError(Exception):
    """Base class of every HomAgg error."""

    def __init__(self, message, code=0):
        super().__init__(message)
        self.code = code


class InvalidArgument(HomAggError, ValueError):
    """A malformed argument: wrong dtype, shape, length, parameter."""


class NonFiniteValue(InvalidArgument):
    """A gradient holds NaN or Inf; ``.index`` is the first bad element."""

    def __init__(self, message, index, worker=None, code=-_errno.EDOM):
        super().__init__(message, code)
        self.index = index
        self.worker = worker


class OutOfRange(InvalidArgument):
    """A count (workers, lanes, slots, sizes) is out of its range."""


class ProtocolError(HomAggError):
    """A packet or a peer broke the protocol."""


class PeerTimeout(HomAggError, TimeoutError):
    """A peer or the aggregator did not answer in time; the message names it."""


class PeerRestarted(ProtocolError, ConnectionResetError):
    """The aggregator restarted (its incarnation changed) during an
    allreduce; the message names it and both incarnations."""


class ResourceError(HomAggError):
    """Allocation failed, a buffer is too small, or a feature is missing."""


# --------------------------------------------------------------------------
# The bindings and the simulator


class SecretFileError(InvalidArgument):
    """The secret file is missing, unsafe (group/world readable) or malformed."""


class WorkerError(HomAggError):
    """One worker's failure inside a group error (``.worker``, ``.code``)."""


# --------------------------------------------------------------------------
# The daemon and its jobs


class ControlError(HomAggError):
    """The daemon refused a request (job exists, no such job, ...)."""


class ConfigError(HomAggError):
    """The HomAgg job of a training process is not configured correctly."""


# --------------------------------------------------------------------------
# Runs


class RunError(HomAggError):
    """The run could not be set up or a process failed."""


class SessionError(HomAggError):
    """A session process could not be started or stopped talking."""


class TrainError(HomAggError):
    """The training run could not be set up or a rank failed."""


# --------------------------------------------------------------------------
# A local testbed (homagg.deploy.local)


class TestbedError(HomAggError):
    """A testbed could not be built, found, used or removed."""

    __test__ = False  # not a pytest test class despite the name


class RootRequired(TestbedError, PermissionError):
    """The operation needs root (network namespaces, veth, tc)."""

    __test__ = False


class TestbedExists(TestbedError, FileExistsError):
    """A testbed (state file or namespace) of that name already exists."""

    __test__ = False


class TestbedNotFound(TestbedError, FileNotFoundError):
    """No state file for that name."""

    __test__ = False


# --------------------------------------------------------------------------
# Inventory hosts (homagg.deploy.remote)


class InventoryError(HomAggError, ValueError):
    """The inventory file is missing, unreadable or invalid.  ``.problems``
    lists every problem (one string each, naming host, field and fix)."""

    def __init__(self, message, problems=(), code=-_errno.EINVAL):
        super().__init__(message, code)
        self.problems = list(problems)


class ProvisionError(HomAggError):
    """A step failed on some hosts.  ``.failures`` is a list of (host, step,
    message, stderr_tail); ``.reports`` maps every host (the healthy ones
    too) to its list of StepResult."""

    def __init__(self, message, failures, reports=None, code=0):
        super().__init__(message, code)
        self.failures = failures
        self.reports = reports or {}


class PreflightError(ProvisionError):
    """A host cannot be used at all (unreachable, key refused, no
    privilege, unsupported OS); raised before anything is changed."""


class StepFailed(HomAggError):
    """One step failed on one host: ``.detail`` names it and the fix,
    ``.stderr`` is the tail of its output (collected into a ProvisionError)."""

    def __init__(self, detail, stderr=""):
        super().__init__(detail)
        self.detail = detail
        self.stderr = stderr


class RemoteError(HomAggError):
    """A remote command failed after the preflight (daemon did not start,
    worker failed, ...); the message names the host."""


class RotateError(HomAggError):
    """A key rotation refused (a job without authentication, a tree job,
    inside the grace period of the last one) or failed on a host
    (``homagg rotate-key``, homagg.deploy.rotate)."""


_BY_ERRNO = {
    _errno.EINVAL: InvalidArgument,
    _errno.EDOM: InvalidArgument,
    _errno.EMSGSIZE: InvalidArgument,
    _errno.ERANGE: OutOfRange,
    _errno.EPROTO: ProtocolError,
    _errno.ETIMEDOUT: PeerTimeout,
    _errno.ECONNRESET: PeerRestarted,
    _errno.ENOMEM: ResourceError,
    _errno.ENOSPC: ResourceError,
    _errno.ENOTSUP: ResourceError,
}


def error_class(rc):
    """The exception class of a negative return code ``rc``."""
    return _BY_ERRNO.get(-rc, HomAggError)


def error_for(rc, context=""):
    """The exception for a negative return code ``rc`` (not raised)."""
    from homagg._native import ffi, lib

    msg = ffi.string(lib.hg_strerror(rc)).decode()
    if context:
        msg = f"{context}: {msg}"
    return error_class(rc)(msg, rc)


def check(rc, context=""):
    """Raise the exception for ``rc`` if it is negative; return ``rc``."""
    if rc < 0:
        raise error_for(rc, context)
    return rc
