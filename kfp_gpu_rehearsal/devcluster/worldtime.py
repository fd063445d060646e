"""The rehearsal world's one time-compression factor (the dev cluster's node boot delays and the stand-ins share it;
:mod:`kfp_gpu_rehearsal.sim.clock` runs the world's timeline on it).

Durations are written in **real-world seconds** (a GPU VM boots in ~4 minutes, so ``median_s: 240``); the world
divides them by :data:`TIME_SCALE`: one real-world minute lasts 0.5 s here. The rehearsal tells the product the
factor through :data:`kfp_gpu.rehearsal_seam.TIME_SCALE_ENV` (its reports are then in world time).
"""

from __future__ import annotations

TIME_SCALE = 120.0  # real-world seconds per stand-in second: one real minute = 0.5 s
# The one name of the factor: every reader goes through scale(), compress() or expand() at call time (a test that
# sets this attribute changes the whole world at once; a by-value copy elsewhere once kept the old factor).


def scale() -> float:
    """:data:`TIME_SCALE`, read now."""
    return TIME_SCALE


def compress(real_world_s: float) -> float:
    """Stand-in (wall-clock) seconds for ``real_world_s`` real-world seconds."""
    return real_world_s / TIME_SCALE


def expand(sim_s: float) -> float:
    """Real-world seconds that ``sim_s`` stand-in seconds stand for (inverse of :func:`compress`)."""
    return sim_s * TIME_SCALE
