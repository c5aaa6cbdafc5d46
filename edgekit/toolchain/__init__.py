"""Vendor toolchains apart from edgekit's environment, and the child-process protocol that runs them.

A vendor's converter (Rockchip's RKNN-Toolkit2, Sony's Model Compression Toolkit and IMX500
converter) pins libraries edgekit cannot share (numpy 1.26, torch 2.4, TensorFlow 2.15), so each
stack lives in a pinned venv of its own under the user's cache (:mod:`~edgekit.toolchain.specs`,
:mod:`~edgekit.toolchain.install`, :mod:`~edgekit.toolchain.store`). Every vendor step runs in
that venv's interpreter as a child process (:mod:`~edgekit.toolchain.child`): the job is a JSON
file and ``.npy`` arrays in a work folder, the answer ``result.json`` and more arrays; the scripts
the child runs are in ``edgekit/toolchain/jobs/`` and import nothing of edgekit. No vendor package
is ever imported into edgekit's process.
"""
