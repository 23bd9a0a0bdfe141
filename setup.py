"""Build glue: the cffi extension homagg._hg (out-of-line API mode).

Metadata lives in pyproject.toml; this file only names the cffi module, whose
builder is orchestrator/homagg/_build_ffi.py.
"""
from setuptools import setup

setup(cffi_modules=["orchestrator/homagg/_build_ffi.py:ffibuilder"])
