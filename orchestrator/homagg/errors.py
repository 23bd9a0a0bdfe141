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
