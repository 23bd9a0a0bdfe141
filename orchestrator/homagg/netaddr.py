"""MAC and IPv4 address parsing, one place for every module.

``parse_mac`` takes ``"02:00:00:00:00:01"`` or 6 bytes and returns 6 bytes;
``parse_ipv4`` takes ``"10.0.0.1"``, an ``ipaddress.IPv4Address`` or an int
and returns the address as an int in host byte order (what the C structs
hold); ``format_ipv4`` turns such an int back into dotted form.  Bad input
raises ``InvalidArgument`` naming the field (``what``).
"""

import ipaddress
import operator

from homagg.errors import InvalidArgument


def parse_mac(mac, what="MAC address") -> bytes:
    if isinstance(mac, (bytes, bytearray)):
        raw = bytes(mac)
    elif isinstance(mac, (list, tuple)):
        try:
            raw = bytes(mac)
        except (TypeError, ValueError):
            raw = b""
    else:
        try:
            raw = bytes(int(x, 16) for x in str(mac).split(":"))
        except ValueError:
            raw = b""
    if len(raw) != 6:
        raise InvalidArgument(
            f"{what}: {mac!r} is not a MAC address (6 bytes, or six hex bytes separated by ':')"
        )
    return raw


def parse_ipv4(addr, what="IPv4 address") -> int:
    if not isinstance(addr, str) and hasattr(addr, "__index__"):
        addr = operator.index(addr)
        if not 0 <= addr < 2**32:
            raise InvalidArgument(f"{what}: {addr} is outside 0..2^32-1")
        return addr
    try:
        return int(ipaddress.IPv4Address(str(addr)))
    except (ipaddress.AddressValueError, ValueError):
        raise InvalidArgument(
            f"{what}: not an IPv4 address: {addr!r} (dotted quad such as 10.0.0.1)"
        ) from None


def format_ipv4(ip: int) -> str:
    return str(ipaddress.IPv4Address(ip))
