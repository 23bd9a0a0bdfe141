"""Thin bindings: one Python function per C function of the public headers.

Each function checks dtype, contiguity, lengths and ranges before the call,
passes buffers without copies (``ffi.from_buffer``) and turns the C return
code into an exception of ``homagg.errors`` after it.  The typed API users
see is one level up (``homagg.codec``).
"""
