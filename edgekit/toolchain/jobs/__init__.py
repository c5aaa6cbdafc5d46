"""The scripts a vendor toolchain's interpreter runs (``python -s jobs/SCRIPT.py job.json``).

They import the vendor's package, numpy and their sibling :mod:`jobwire`, never edgekit (it is
not installed in a toolchain's venv). This package is host-side: only edgekit's build and the
simulator session start them, and only :mod:`jobwire` is imported into edgekit's process.
"""
