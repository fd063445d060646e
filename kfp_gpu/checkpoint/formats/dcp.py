"""torch.distributed.checkpoint (DCP) directories: ``*.distcp`` data files plus one ``.metadata`` file.

``dcp.save`` has every rank write its ``*.distcp`` files, gathers their write results to the coordinator, and
only then does the coordinator's ``FileSystemWriter.finish`` write ``.metadata`` (to ``.metadata.tmp``, then a
rename): torch/distributed/checkpoint/state_dict_saver.py ``_save_state_dict`` (``write_data`` then
``finish_checkpoint`` under ``all_reduce``) and filesystem.py ``_FileSystemWriter.finish``. Completeness rule:
``.metadata`` is present. A directory with data files or ``.metadata.tmp`` but no ``.metadata`` is partial.
The step is the last number in the directory's name (``step_120``, ``global_step120``, ``epoch=1-step=120.ckpt``);
a DCP directory whose name has no number is skipped with a warning. The rule needs one directory per save: saving
again into an existing directory overwrites its shards while the old ``.metadata`` is still there (``finish`` replaces
it only at the end), so a save killed midway there leaves a directory that looks complete.
"""

from __future__ import annotations

import sys

from kfp_gpu.checkpoint.formats.base import Candidate, Listing, Partial, modified, trailing_step

NAME = "dcp"
METADATA = ".metadata"


def _ok() -> None:
    return None


def scan(listing: Listing) -> tuple[list[Candidate], list[Partial]]:
    """Directories holding ``.metadata``, ``.metadata.tmp`` or ``*.distcp`` files. Never raises (no reads)."""
    out: list[Candidate] = []
    partial: list[Partial] = []
    for d, names in sorted(listing.dirs().items()):
        if METADATA not in names and f"{METADATA}.tmp" not in names and not any(n.endswith(".distcp") for n in names):
            continue
        listing.claimed.add(d)
        step = trailing_step(d) if d else None
        if step is None:
            partial.append(Partial(NAME, sys.maxsize, d, "no step number in the directory's name (e.g. step_120)"))
        elif METADATA not in names:
            partial.append(Partial(NAME, step, d, f"no {METADATA} (DCP writes it last, after every rank's data)"))
        else:
            out.append(Candidate(NAME, step, d, modified(listing.backend, f"{d}/{METADATA}"), _ok))
    return out, partial
