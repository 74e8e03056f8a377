"""The C extensions (the kernels; the SIGBUS guard of the file maps): setuptools builds them;
everything else is declared in pyproject.toml.

`optional=True`: without a C compiler the package still installs and runs on its pure-Python
paths (same bytes, slower); tests/storage/test_native.py and
tests/storage/test_mapguard.py fail loudly if CI loses a module.
"""

# The repository root is the package, so this file also ships as the module `mqstore.setup`:
# importing it must not run a build (review 73 L5), nor need setuptools, which a venv of Python
# 3.12 or newer does not have (a tool walking the package's modules failed on the import).
# setuptools runs it as __main__.
if __name__ == "__main__":
    from setuptools import Extension, setup

    setup(
        ext_modules=[
            Extension(
                "mqstore.storage._native",
                sources=["storage/_native.c"],
                optional=True,
                extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
            ),
            Extension(
                "mqstore.storage._mapguard",
                sources=["storage/_mapguard.c"],
                optional=True,
                extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            ),
        ]
    )
