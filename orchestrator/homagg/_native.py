"""The compiled module, loaded once, with its ABI version checked.

``ffi`` and ``lib`` come from homagg._hg (built by ``make build``).  Importing
this module fails with an actionable message when the extension is missing
or was built from other C sources.
"""

from homagg.errors import HomAggError

_ABI_VERSION = 2

try:
    from homagg._hg import ffi, lib  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError(
        "homagg's C extension (homagg._hg) is not built: run `make build` "
        f"in the repository root ({exc})"
    ) from exc

if lib.hg_abi_version() != _ABI_VERSION or lib.HG_ABI_VERSION != _ABI_VERSION:
    raise HomAggError(
        f"homagg._hg has ABI {lib.hg_abi_version()}, the Python package expects "
        f"{_ABI_VERSION}: rebuild with `make build`"
    )
