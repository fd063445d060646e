"""Multi-rank commits: every rank writes its part of a checkpoint; the marker is written once all are present.

Protocol for one save of ``step`` by ``world`` ranks (stdlib only; the torch.distributed glue that agrees on
the attempt name and runs the barrier lives in :mod:`kfp_gpu.checkpoint.dcp_io`)::

    step-000000120.tmp-1a2b3c4d/       one attempt prefix, the same name on every rank (rank 0 picks it)
        __0_0.distcp  __1_0.distcp     each rank's shard (any files: DCP's, or PayloadWriter.put)
        .metadata                      DCP's global metadata (rank 0, inside dcp.save)
        rank-1/extra.pt ...            per-rank files (RNG state...)
        rank-0.done  rank-1.done       each rank's manifest, written after all of its files: step, world,
                                       name -> sha256 + size of every file that rank wrote
        COMMITTED                      rank 0, last, only after it *read* every rank-K.done back from the
                                       store and saw every file they list in a listing of the attempt

A barrier alone is not trusted: a rank can die after it, or a collective can return on a rank whose
writes never landed. Rank 0 therefore checks the store itself, waiting at most ``timeout_s`` (the
remaining grace period in an emergency save). A missing or inconsistent part raises
:class:`RanksIncomplete` and leaves the attempt *uncommitted*: :meth:`CheckpointStore.latest` skips it
and names it in a warning ("no COMMITTED marker (partial write; 1 rank(s) finished their part)").
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from kfp_gpu.checkpoint.backends import BlobNotFound
from kfp_gpu.checkpoint.errors import CheckpointError
from kfp_gpu.checkpoint.layout import Checkpoint
from kfp_gpu.checkpoint.store import CheckpointStore, PayloadWriter

log = logging.getLogger("kfp_gpu.checkpoint")


class RanksIncomplete(CheckpointError):
    """A multi-rank save was not committed: some rank's part is missing or inconsistent. Transient."""

    transient = True


def done_name(rank: int) -> str:
    """The manifest file rank ``rank`` writes last: ``rank-<K>.done``."""
    return f"rank-{rank}.done"


class RankedSave:
    """One rank's part of a multi-rank save into the shared attempt prefix ``attempt``.

    Write files with :attr:`writer` (``put`` / ``open``) or :meth:`record` files written by another
    writer (DCP), then call :meth:`finish_rank`. Rank 0 then calls :meth:`commit`.
    """

    def __init__(self, store: CheckpointStore, step: int, attempt: str, *, rank: int, world: int) -> None:
        """Raises: ValueError for a rank outside ``[0, world)`` or a negative step."""
        if world < 1 or not 0 <= rank < world or step < 0:
            raise ValueError(f"bad multi-rank save: step={step} rank={rank} world={world}")
        self.store, self.step, self.attempt, self.rank, self.world = store, step, attempt, rank, world
        self.writer = PayloadWriter(store.backend, attempt)
        self._recorded: dict[str, tuple[str, int]] = {}

    def record(self, name: str, digest: str, size: int) -> None:
        """Note a file this rank wrote into the attempt by other means (e.g. a DCP shard)."""
        self._recorded[name] = (digest, size)

    def files(self) -> dict[str, tuple[str, int]]:
        """Every file this rank wrote so far: name -> (sha256, size)."""
        out = dict(self._recorded)
        out.update({n: (self.writer.files[n], self.writer.sizes[n]) for n in self.writer.files})
        return out

    def finish_rank(self) -> None:
        """Write ``rank-<K>.done`` listing this rank's files. Call it after every file of this rank landed.

        Raises: StorageError when the write fails.
        """
        doc = {"step": self.step, "rank": self.rank, "world": self.world, "attempt": self.attempt,
               "files": {n: {"sha256": d, "size": z} for n, (d, z) in sorted(self.files().items())}}
        self.writer.put(done_name(self.rank), json.dumps(doc, sort_keys=True).encode())

    def commit(
        self,
        meta: Mapping[str, Any] | None = None,
        *,
        timeout_s: float = 60.0,
        poll_s: float = 0.05,
        require: tuple[str, ...] = (),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Checkpoint:
        """Rank 0: wait (at most ``timeout_s``) until every rank's manifest and every file it lists are in
        the store, plus the ``require``d names (e.g. DCP's ``.metadata``); then write the marker.

        Raises:
            RanksIncomplete: a part is still missing at the deadline, or a manifest is inconsistent
                (wrong step, world size or attempt). The attempt is left uncommitted (never latest).
            StorageError: the store failed.
            ValueError: called on a rank other than 0.
        """
        if self.rank != 0:
            raise ValueError(f"only rank 0 commits a multi-rank save (this is rank {self.rank})")
        deadline = clock() + max(0.0, timeout_s)
        while True:
            missing, files = self._check(require)
            if not missing:
                break
            if clock() >= deadline:
                raise RanksIncomplete(
                    f"checkpoint step {self.step} at {self.store.uri}/{self.attempt} not committed after "
                    f"{timeout_s:.1f} s: missing {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}",
                    remediation="a rank died or was preempted mid-save; resume from the newest complete checkpoint",
                    uri=f"{self.store.uri}/{self.attempt}", step=self.step,
                )
            sleep(poll_s)
        full_meta = {**dict(meta or {}), "ranks": self.world}
        return self.store.commit_attempt(self.attempt, self.step, files, full_meta, ranks=self.world)

    def _check(self, require: tuple[str, ...]) -> tuple[list[str], dict[str, tuple[str, int]]]:
        """(what is missing, every file to list in the marker). Raises RanksIncomplete when inconsistent."""
        with self.store._io(f"listing {self.attempt}"):
            present = {k.partition("/")[2] for k in self.store.backend.list(self.attempt + "/")}
        missing = [n for n in require if n not in present]
        files: dict[str, tuple[str, int]] = {}
        for rank in range(self.world):
            name = done_name(rank)
            if name not in present:
                missing.append(name)
                continue
            with self.store._io(f"reading {self.attempt}/{name}"):
                try:
                    raw = self.store.backend.get(f"{self.attempt}/{name}")
                except BlobNotFound:
                    missing.append(name)
                    continue
            listed = _parse_done(raw, name, self)
            files[name] = (hashlib.sha256(raw).hexdigest(), len(raw))
            for fname, entry in listed.items():
                if fname not in present:
                    missing.append(f"{fname} (rank {rank})")
                elif fname in files and fname not in require and files[fname] != entry:
                    raise self._inconsistent(f"{fname} is listed by two ranks with different contents")
                files[fname] = entry
        for name in require:
            if name in present and name not in files:
                raise self._inconsistent(f"{name} is present but no rank's manifest lists it")
        return missing, files

    def _inconsistent(self, why: str) -> RanksIncomplete:
        return RanksIncomplete(
            f"checkpoint step {self.step} at {self.store.uri}/{self.attempt} not committed: {why}",
            remediation="two saves wrote into one attempt prefix; every rank must use the name rank 0 chose",
            uri=f"{self.store.uri}/{self.attempt}", step=self.step,
        )


def _parse_done(raw: bytes, name: str, save: RankedSave) -> dict[str, tuple[str, int]]:
    try:
        doc = json.loads(raw.decode())
        listed = {str(k): (str(v["sha256"]), int(v["size"])) for k, v in dict(doc["files"]).items()}
        same = (int(doc["step"]), int(doc["world"]), str(doc["attempt"])) == (save.step, save.world, save.attempt)
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise save._inconsistent(f"unreadable {name} ({type(exc).__name__}: {exc})") from None
    if not same:
        raise save._inconsistent(f"{name} names step {doc.get('step')} world {doc.get('world')} "
                                 f"attempt {doc.get('attempt')!r}")
    return listed
