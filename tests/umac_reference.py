"""UMAC-AES (RFC 4418), written from the RFC in Python and numpy, as the
reference the project's C is checked against (tests/test_auth_umac.py).

AES-128 is the ``cryptography`` package's (OpenSSL); NH runs on numpy's
wrapping uint64 arithmetic, everything else on Python integers.  Nothing
here calls the project's code.  ``umac(key, msg, nonce, taglen)`` is RFC
4418's UMAC with 4, 8, 12 or 16-byte tags; the project's ``umac`` MAC is
``umac(key[:16], header + payload, nonce, 16)``.
"""

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

P36 = 2**36 - 5
P64 = 2**64 - 59
P128 = 2**128 - 159


def _aes(key, block):
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    return enc.update(block) + enc.finalize()


def kdf(key, index, numbytes):
    """RFC 4418 3.2.1: AES-128 in counter mode on (index, i)."""
    out = b""
    for i in range(1, -(-numbytes // 16) + 1):
        out += _aes(key, index.to_bytes(8, "big") + i.to_bytes(8, "big"))
    return out[:numbytes]


def pdf(key, nonce, taglen):
    """RFC 4418 3.3: the pad of a nonce (1..16 bytes)."""
    if taglen in (4, 8):
        n = 16 // taglen
        index = int.from_bytes(nonce, "big") % n
        nonce = (int.from_bytes(nonce, "big") ^ index).to_bytes(len(nonce), "big")
    else:
        index = 0
    t = _aes(kdf(key, 0, 16), nonce + bytes(16 - len(nonce)))
    return t[index * taglen : index * taglen + taglen]


def nh(key, msg):
    """RFC 4418 5.2.2 on an ENDIAN-SWAPped message: message words read
    little-endian, key words big-endian; len(msg) a multiple of 32."""
    m = np.frombuffer(msg, dtype="<u4").astype(np.uint64)
    k = np.frombuffer(key[: len(msg)], dtype=">u4").astype(np.uint64)
    s = ((m + k) & np.uint64(0xFFFFFFFF)).reshape(-1, 8)
    with np.errstate(over="ignore"):
        return int(np.sum(s[:, :4] * s[:, 4:], dtype=np.uint64))


def l1_hash(key, msg):
    """RFC 4418 5.2.1: NH of each 1024-byte chunk plus its length in bits."""
    out = []
    chunks = [msg[i : i + 1024] for i in range(0, len(msg), 1024)] or [b""]
    for c in chunks:
        bits = len(c) * 8
        padded = c + bytes(-len(c) % 32 if c else 32)
        out.append((nh(key, padded) + bits) % 2**64)
    return out


def _poly(wordbits, maxwordrange, k, words):
    p = {64: P64, 128: P128}[wordbits]
    offset, marker = 2**wordbits - p, p - 1
    y = 1
    for m in words:
        if m >= maxwordrange:
            y = (k * y + marker) % p
            y = (k * y + (m - offset)) % p
        else:
            y = (k * y + m) % p
    return y


def l2_hash(key, l1):
    """RFC 4418 5.3 on the L1 outputs (64-bit integers): POLY-64 over the
    first 2^14 of them, POLY-128 over the rest; 16 bytes."""
    k64 = int.from_bytes(key[:8], "big") & 0x01FFFFFF01FFFFFF
    k128 = int.from_bytes(key[8:24], "big") & 0x01FFFFFF01FFFFFF01FFFFFF01FFFFFF
    y = _poly(64, 2**64 - 2**32, k64, l1[: 2**14])
    if len(l1) > 2**14:
        rest = b"".join(v.to_bytes(8, "big") for v in l1[2**14 :]) + b"\x80"
        rest += bytes(-len(rest) % 16)
        words = [y] + [int.from_bytes(rest[i : i + 16], "big") for i in range(0, len(rest), 16)]
        y = _poly(128, 2**128 - 2**96, k128, words)
    return y.to_bytes(16, "big")


def l3_hash(k1, k2, b):
    """RFC 4418 5.4: inner product modulo 2^36 - 5 of eight 16-bit words."""
    y = 0
    for i in range(8):
        m = int.from_bytes(b[2 * i : 2 * i + 2], "big")
        k = int.from_bytes(k1[8 * i : 8 * i + 8], "big") % P36
        y = (y + m * k) % P36
    y %= 2**32
    return (y ^ int.from_bytes(k2, "big")).to_bytes(4, "big")


def uhash(key, msg, taglen):
    """RFC 4418 4: taglen / 4 iterations of L1, L2 and L3."""
    iters = taglen // 4
    l1key = kdf(key, 1, 1024 + (iters - 1) * 16)
    l2key = kdf(key, 2, iters * 24)
    l3key1 = kdf(key, 3, iters * 64)
    l3key2 = kdf(key, 4, iters * 4)
    out = b""
    for i in range(iters):
        a = l1_hash(l1key[i * 16 : i * 16 + 1024], msg)
        if len(msg) <= 1024:
            b = bytes(8) + a[0].to_bytes(8, "big")
        else:
            b = l2_hash(l2key[i * 24 : i * 24 + 24], a)
        out += l3_hash(l3key1[i * 64 : i * 64 + 64], l3key2[i * 4 : i * 4 + 4], b)
    return out


def umac(key, msg, nonce, taglen=16):
    """RFC 4418 3: UHASH(msg) xor PDF(nonce), taglen bytes (4, 8, 12, 16)."""
    h = uhash(key, bytes(msg), taglen)
    return bytes(x ^ y for x, y in zip(h, pdf(key, bytes(nonce), taglen)))
