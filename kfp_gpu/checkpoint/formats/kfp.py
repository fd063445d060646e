"""kfp-gpu's own format: ``step-<9+ digits>[.tmp-<nonce>]/`` directories written by :class:`CheckpointStore`.

Completeness rule (the store's own, see docs/checkpointing.md): the ``COMMITTED`` marker, written after every
payload file, parses and names the directory's step, and every payload file's sha256 matches the marker. The
marker is read during the scan; the checksums are verified by ``check()``, newest candidate first (what
:meth:`CheckpointStore.latest` does).
"""

from __future__ import annotations

from kfp_gpu.checkpoint.errors import CheckpointCorrupt
from kfp_gpu.checkpoint.formats.base import Candidate, Check, Listing, Partial
from kfp_gpu.checkpoint.layout import Checkpoint
from kfp_gpu.checkpoint.store import CheckpointStore

NAME = "kfp-gpu"


def scan(listing: Listing) -> tuple[list[Candidate], list[Partial]]:
    """Committed checkpoints and incomplete attempts of the store at the listing's root.

    Raises: StorageError when reading a marker fails.
    """
    store = CheckpointStore(listing.backend.uri, backend=listing.backend)
    done, partial = store.scan()
    listing.claimed.update(c.name for c in done)
    listing.claimed.update(i.name for i in partial)
    out = [Candidate(NAME, c.step, c.name, c.created, _verifier(store, c), dict(c.meta)) for c in done]
    missing = [Partial(NAME, i.step, i.name, i.reason) for i in partial]
    return out, missing


def _verifier(store: CheckpointStore, ckpt: Checkpoint) -> Check:
    def check() -> str | None:
        try:
            store.load(ckpt)
        except CheckpointCorrupt as exc:
            return exc.message
        return None

    return check

