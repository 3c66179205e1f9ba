"""Only the C extension; everything else is in pyproject.toml (ext-modules there is still experimental)."""

from setuptools import Extension, setup

# The loader's hot path in C; wdsprep/reader.py does the same in Python when it is missing.
# Optional: without a C compiler the install still succeeds, only slower.
setup(ext_modules=[Extension("wdsprep._native", ["wdsprep/_native.c"], optional=True,
                             extra_compile_args=["-O2"])])
