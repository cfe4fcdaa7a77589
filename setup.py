"""Packaging rule: the repository root is the package `ltpx`, and every folder
below dataplane/, control/ and tools/ that holds an __init__.py is one of its
subpackages, found here so none can be left out of a wheel. Everything else
is declared in pyproject.toml."""
from setuptools import find_packages, setup

PARTS = ["dataplane", "dataplane.*", "control", "control.*", "tools", "tools.*"]

setup(packages=["ltpx"] + [f"ltpx.{p}" for p in find_packages(".", include=PARTS)],
      package_dir={"ltpx": "."})
