"""Argument checks shared by the binding modules: every buffer is a 1-D
C-contiguous numpy array of the dtype the C side expects, passed without a
copy (``_buf`` / ``_wbuf``)."""

import numpy as np

from homagg._native import ffi
from homagg.errors import InvalidArgument

F32 = np.dtype(np.float32)
I8 = np.dtype(np.int8)
U8 = np.dtype(np.uint8)
BE32 = np.dtype(">i4")


def _array(a, name, dtypes, writable=False):
    """Check that a is a 1-D C-contiguous array of one of dtypes."""
    if not isinstance(a, np.ndarray):
        raise InvalidArgument(f"{name}: expected a numpy array, got {type(a).__name__}")
    if a.ndim != 1:
        raise InvalidArgument(f"{name}: expected a 1-D array, got shape {a.shape}")
    if a.dtype not in dtypes:
        want = " or ".join(str(d) for d in dtypes)
        raise InvalidArgument(f"{name}: expected dtype {want}, got {a.dtype.str}")
    if not a.flags.c_contiguous:
        raise InvalidArgument(f"{name}: array is not C-contiguous (pass np.ascontiguousarray(...))")
    if writable and not a.flags.writeable:
        raise InvalidArgument(f"{name}: output array is read-only")
    return a


def _f32(a, name="x", writable=False):
    return _array(a, name, (F32,), writable)


def _i8(a, name, writable=False):
    return _array(a, name, (I8,), writable)


def _u8(a, name, writable=False):
    return _array(a, name, (U8,), writable)


def _be32(a, name, writable=False):
    """int32 wire lanes: '>i4', or raw uint8 bytes (multiple of 4)."""
    _array(a, name, (BE32, U8), writable)
    if a.dtype == U8 and a.size % 4:
        raise InvalidArgument(f"{name}: raw int32 lanes need a multiple of 4 bytes, got {a.size}")
    return a


def _lanes32(a):
    return a.size if a.dtype == BE32 else a.size // 4


def _length(a, want, name, unit="elements"):
    have = _lanes32(a) if a.dtype == BE32 or (a.dtype == U8 and unit == "lanes") else a.size
    if have != want:
        raise InvalidArgument(f"{name}: expected {want} {unit}, got {have}")


def _buf(ctype, a):
    return ffi.from_buffer(ctype, a, require_writable=False)


def _wbuf(ctype, a):
    return ffi.from_buffer(ctype, a, require_writable=True)


def _fill(cstruct, fields):
    """Set the fields of a cffi struct from a dict; bytes go into byte
    arrays (a MAC, a secret) as lists."""
    for k, v in fields.items():
        if isinstance(v, dict):  # a nested struct (hg_params.cost)
            _fill(getattr(cstruct, k), v)
        else:
            setattr(cstruct, k, list(v) if isinstance(v, (bytes, bytearray)) else v)
    return cstruct


def _struct_dict(st, ctype):
    """Every field of a cffi struct (read from its cdef) as a dict."""
    return {name: getattr(st, name) for name, _ in ffi.typeof(ctype).fields}
