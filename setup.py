# SPDX-License-Identifier: Apache-2.0
"""Packaging rule: the repository root is the package `ltpx`, and every folder
below dataplane/, control/ and tools/ that holds an __init__.py is one of its
subpackages, found here so none can be left out of a wheel. Everything else
is declared in pyproject.toml. tests/test_packaging.py builds a wheel and
checks what it holds."""
from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

PARTS = ["dataplane", "dataplane.*", "control", "control.*", "tools", "tools.*"]


class BuildPy(build_py):
    """build_py without ltpx/setup.py: this file sits in the package's folder
    (the root) but is the build script, not a module of ltpx."""

    def find_package_modules(self, package, package_dir):
        return [m for m in super().find_package_modules(package, package_dir)
                if not (package == "ltpx" and m[1] == "setup")]


setup(packages=["ltpx"] + [f"ltpx.{p}" for p in find_packages(".", include=PARTS)],
      package_dir={"ltpx": "."}, cmdclass={"build_py": BuildPy})
