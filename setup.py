"""The C extension: setuptools builds it; everything else is declared in pyproject.toml.

`optional=True`: without a C compiler the package still installs and runs on its pure-Python
paths (same bytes, slower); tests/storage/test_native.py fails loudly if CI loses the module.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "mqstore.storage._native",
            sources=["storage/_native.c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
        )
    ]
)
