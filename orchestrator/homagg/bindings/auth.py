"""Bindings of homagg/auth.h: job keys and frame MACs (libsodium).

One function per C function; lengths are checked before the call, a
negative return code becomes an exception of ``homagg.errors``.  The typed
API is ``homagg.auth`` (secret files, keys).
"""
from homagg._native import ffi, lib
from homagg.errors import InvalidArgument, check

SECRET_LEN = lib.HG_AUTH_SECRET_LEN
KEY_LEN = lib.HG_AUTH_KEY_LEN
MAC_LEN = lib.HG_MAC_LEN
KEY_AGGREGATOR = lib.HG_AUTH_KEY_AGGREGATOR


def fixed_bytes(v, size, what):
    v = bytes(v)
    if len(v) != size:
        raise InvalidArgument(f"{what} has {size} bytes, got {len(v)}")
    return v


def derive_key(secret, key_id):
    """hg_auth_derive_key: the key key_id (a worker id or KEY_AGGREGATOR) of secret."""
    secret = fixed_bytes(secret, SECRET_LEN, "a job secret")
    key = ffi.new("uint8_t[]", KEY_LEN)
    check(lib.hg_auth_derive_key(secret, int(key_id), key), f"derive key {key_id}")
    return bytes(key)


def mac(key, data):
    """hg_auth_mac: the MAC_LEN-byte MAC of data under key."""
    key = fixed_bytes(key, KEY_LEN, "a key")
    data = bytes(data)
    out = ffi.new("uint8_t[]", MAC_LEN)
    check(lib.hg_auth_mac(key, data, len(data), out), "mac")
    return bytes(out)


def verify(key, data, tag):
    """hg_auth_verify: does tag verify for data under key (constant time)?"""
    key = fixed_bytes(key, KEY_LEN, "a key")
    tag = fixed_bytes(tag, MAC_LEN, "a MAC")
    data = bytes(data)
    return bool(lib.hg_auth_verify(key, data, len(data), tag))
