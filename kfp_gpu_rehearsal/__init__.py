"""The local rehearsal world of kfp-gpu: the cloud stand-ins (:mod:`kfp_gpu_rehearsal.sim`), the dev cluster
(:mod:`kfp_gpu_rehearsal.devcluster`: Go builds, KWOK stages, the component runner) and the rehearsal command
(:mod:`kfp_gpu_rehearsal.demo`, behind ``kfp-gpu run`` / ``kfp-gpu demo``).

A distribution of its own (``kfp-gpu-rehearsal``, ``pyproject.toml`` in this directory), versioned in lockstep with
``kfp-gpu`` and installed by its ``rehearsal`` extra. It depends on the product; the product reaches it only through
:mod:`kfp_gpu.rehearsal_seam` (tests/unit/test_layering.py).
"""
