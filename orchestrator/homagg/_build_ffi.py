"""cffi builder of homagg._hg (out-of-line API mode).

The cdef is read from the public C headers themselves: the text between the
``/* cdef-begin */`` and ``/* cdef-end */`` markers of each header listed in
HEADERS, with every ``#define NAME value`` turned into ``#define NAME ...`` so
that C stays the single source of truth for constants.  A block that uses
an X-macro table (``HG_FOREACH_*``, homagg/protocol.h) is first expanded by
the C preprocessor, so the enums cffi sees are the ones the tables generate.

The extension links the static library built by the Makefile, found in
$HOMAGG_LIBDIR (default build/release).  $HOMAGG_SANITIZE adds sanitizer
flags to the extension itself.
"""

import os
import pathlib
import re
import shlex
import subprocess

from cffi import FFI

ROOT = pathlib.Path(__file__).resolve().parents[2]
INCLUDE_DIRS = [
    ROOT / "dataplane_c" / "include",
    ROOT / "nic" / "include",
    ROOT / "sim" / "include",
]
# Order matters: a header's types must come before their users.
HEADERS = [
    "homagg/errors.h",
    "homagg/protocol.h",
    "homagg/codec.h",
    "homagg/kernels.h",
    "homagg/wire.h",
    "homagg/auth.h",
    "homagg/port.h",
    "homagg/port_mem.h",
    "homagg/port_udp.h",
    "homagg/engine.h",
    "homagg/bench.h",
    "homagg/nic.h",
    "homagg/client.h",
    "homagg/sim.h",
]

_BLOCK = re.compile(r"/\* cdef-begin \*/(.*?)/\* cdef-end \*/", re.S)
_DEFINE = re.compile(r"^#define\s+(\w+)\s+.*$", re.M)


def _find(header):
    for d in INCLUDE_DIRS:
        path = d / header
        if path.exists():
            return path
    return None


_LINEMARKER = re.compile(r'^# \d+ "(.*)"')


def _expanded_blocks(path):
    """The header's own cdef blocks after the C preprocessor (comments kept,
    so the markers survive; directives gone, so constants are taken from the
    raw block).  The line markers tell its lines from those of the headers
    it includes, whose blocks are read on their own."""
    cpp = shlex.split(os.environ.get("CC", "cc")) + ["-E", "-C", "-std=gnu11"]
    cpp += [f"-I{d}" for d in INCLUDE_DIRS]
    out = subprocess.run(cpp + [str(path)], check=True, capture_output=True, text=True).stdout
    own, current = [], None
    for line in out.splitlines():
        m = _LINEMARKER.match(line)
        if m:
            current = m.group(1)
        elif current == str(path):
            own.append(line)
    return _BLOCK.findall("\n".join(own))


def cdef_text():
    parts = []
    for header in HEADERS:
        path = _find(header)
        if path is None:
            continue
        raw = _BLOCK.findall(path.read_text())
        if any("HG_FOREACH_" in block for block in raw):
            for block, expanded in zip(raw, _expanded_blocks(path)):
                defines = [m.group(0) for m in _DEFINE.finditer(block)]
                parts.append("\n".join(_DEFINE.sub(r"#define \1 ...", d) for d in defines))
                parts.append(expanded)
            continue
        for block in raw:
            parts.append(_DEFINE.sub(r"#define \1 ...", block))
    return "\n".join(parts)


def present_headers():
    return [h for h in HEADERS if _find(h) is not None]


ffibuilder = FFI()
ffibuilder.cdef(cdef_text())

_libdir = pathlib.Path(os.environ.get("HOMAGG_LIBDIR", ROOT / "build" / "release"))
_san = os.environ.get("HOMAGG_SANITIZE", "")
_sanflags = [f"-fsanitize={_san}", "-fno-omit-frame-pointer"] if _san else []

ffibuilder.set_source(
    "homagg._hg",
    "\n".join(f'#include "{h}"' for h in present_headers()),
    include_dirs=[str(d) for d in INCLUDE_DIRS],
    extra_objects=[str(_libdir / "libhomagg.a")],
    extra_compile_args=["-O2", "-std=gnu11"] + _sanflags,
    extra_link_args=_sanflags,
    libraries=["sodium", "crypto", "m"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
