"""CheckpointStore: atomic, verifiable checkpoints on a local path or an object store.

Layout under the store's root URI::

    step-000000120/            a committed checkpoint (local filesystems: renamed into place)
        model.pt ...           payload files
        COMMITTED              the marker, written last: step, sha256 + size of every payload file, time, meta
    step-000000130.tmp-1a2b3c4d/   an attempt: in progress, crashed, or (object stores) committed in place

Commit protocol: every save writes its payload into a fresh attempt prefix ``step-N.tmp-<nonce>/``, then the
``COMMITTED`` marker last. On a local filesystem the attempt directory is then renamed to ``step-N``
(atomic); object stores have no rename, so there the marker PUT (atomic per object) is the commit point
and the attempt prefix keeps its name. Either way a checkpoint is *complete* iff its marker parses,
names the same step, and every payload file's sha256 matches. :meth:`CheckpointStore.latest` returns the
newest complete checkpoint and logs a warning naming each newer partial or corrupt one it skipped.
The names and the marker format are :mod:`kfp_gpu.checkpoint.layout`; this module does the I/O.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import io
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kfp_gpu.checkpoint.backends import Backend, BlobNotFound, credentials_hint, open_backend
from kfp_gpu.checkpoint.errors import (
    CheckpointCorrupt,
    CheckpointError,
    CheckpointNotFound,
    StorageError,
)
from kfp_gpu.checkpoint.layout import (
    MARKER,
    NAME_RE,
    RANK_DONE_RE,
    Checkpoint,
    Incomplete,
    attempt_name,
    check_name,
    marker,
    parse_marker,
)

log = logging.getLogger("kfp_gpu.checkpoint")


class PayloadWriter:
    """Handed to a callable payload: ``put(name, data)`` or ``with open(name) as fh: fh.write(...)``."""

    def __init__(self, backend: Backend, prefix: str) -> None:
        self._backend = backend
        self._prefix = prefix
        self.files: dict[str, str] = {}
        self.sizes: dict[str, int] = {}

    def put(self, name: str, data: bytes) -> None:
        """Write one payload file.

        Raises: ValueError for a bad name or a name written twice; StorageError when the backend fails.
        """
        check_name(name)
        if name in self.files:
            raise ValueError(f"payload file {name!r} written twice")
        try:
            self._backend.put(f"{self._prefix}/{name}", bytes(data))
        except Exception as exc:
            raise _storage_error(self._backend.uri, f"writing {self._prefix}/{name}", exc) from exc
        self.files[name] = hashlib.sha256(data).hexdigest()
        self.sizes[name] = len(data)

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[io.BytesIO]:
        """A binary file-like object; its contents are stored as ``name`` when the block exits cleanly."""
        check_name(name)
        buf = io.BytesIO()
        yield buf
        self.put(name, buf.getvalue())


Payload = Mapping[str, bytes] | Callable[[PayloadWriter], None]
_Checkpoints = list[Checkpoint]  # the class below defines a method named ``list``


class CheckpointStore:
    """Checkpoints under one root URI (a path, ``file://``, ``s3://``, ``gs://`` or an fsspec URL)."""

    def __init__(self, uri: str, *, backend: Backend | None = None) -> None:
        """Raises: StorageUnavailable (SDK missing) or StorageError (client could not be built)."""
        self.uri = uri.rstrip("/") or uri
        self.backend = backend if backend is not None else open_backend(uri)

    def __repr__(self) -> str:
        return f"CheckpointStore({self.uri!r})"

    # ---- writing -------------------------------------------------------------------------------------

    def save(self, step: int, payload: Payload, meta: Mapping[str, Any] | None = None) -> Checkpoint:
        """Write and commit a checkpoint for ``step`` (the last completed step).

        ``payload`` is a mapping of file name -> bytes, or a callable that receives a
        :class:`PayloadWriter`. ``meta`` must be JSON-serialisable; it is stored in the marker.

        Raises:
            ValueError: negative step, bad payload file name, or ``meta`` not JSON-serialisable.
            StorageError: the backend failed (transient).
            Exception: whatever a callable ``payload`` raises, unchanged.
            In every case the attempt is cleaned up best-effort, and no reader ever sees it as complete.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        meta_obj = dict(meta or {})
        try:
            json.dumps(meta_obj)  # fail before writing anything
        except (TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint meta must be JSON-serialisable: {exc}") from None
        attempt = attempt_name(step)
        writer = PayloadWriter(self.backend, attempt)
        try:
            if callable(payload):
                payload(writer)  # errors from the caller's writer propagate unchanged
            else:
                for name, data in payload.items():
                    writer.put(name, data)
            return self.commit_attempt(
                attempt, step, {n: (writer.files[n], writer.sizes[n]) for n in writer.files}, meta_obj
            )
        except Exception:
            self._discard(attempt)
            raise

    def commit_attempt(
        self, attempt: str, step: int, files: Mapping[str, tuple[str, int]], meta: Mapping[str, Any],
        *, ranks: int | None = None,
    ) -> Checkpoint:
        """Write the ``COMMITTED`` marker of an attempt whose payload is already in the store, then (local
        filesystems) rename it to ``step-N``. ``files`` maps payload name -> (sha256, size). This is the
        commit point; :mod:`kfp_gpu.checkpoint.sharded` calls it once every rank's part is verified present.

        Raises: StorageError when the marker write or the rename fails (the attempt stays uncommitted).
        """
        now = time.time()
        with self._io(f"committing step {step}"):
            self.backend.put(f"{attempt}/{MARKER}", marker(step, files, meta, now, ranks))
            final = f"step-{step:09d}"
            name = final if self.backend.rename_prefix(attempt, final) else attempt
        ckpt = Checkpoint(step, name, self._uri(name), {n: d for n, (d, _) in files.items()},
                          {n: z for n, (_, z) in files.items()}, now, dict(meta))
        log.info("checkpoint step %d committed at %s (%d files, %d bytes)",
                 step, ckpt.uri, len(ckpt.files), sum(ckpt.sizes.values()))
        return ckpt

    def _discard(self, attempt: str) -> None:
        try:
            self.backend.delete_prefix(attempt)
        except Exception as exc:  # best effort: an unmarked attempt is never used anyway
            log.warning("could not clean up checkpoint attempt %s: %s", self._uri(attempt), exc)

    # ---- reading -------------------------------------------------------------------------------------

    def scan(self) -> tuple[list[Checkpoint], list[Incomplete]]:
        """Committed checkpoints (marker present and well-formed; checksums NOT verified) and incomplete
        attempts, both sorted oldest first.

        Raises: StorageError when listing or reading a marker fails.
        """
        with self._io("listing"):
            keys = self.backend.list()
        groups: dict[str, set[str]] = {}
        for key in keys:
            top, _, rest = key.partition("/")
            if rest and NAME_RE.match(top):
                groups.setdefault(top, set()).add(rest)
        done: list[Checkpoint] = []
        partial: list[Incomplete] = []
        for name, files in groups.items():
            step = int(NAME_RE.match(name).group(1))  # type: ignore[union-attr]
            if MARKER not in files:
                done_ranks = sum(1 for f in files if RANK_DONE_RE.match(f))
                ranks = f"; {done_ranks} rank(s) finished their part" if done_ranks else ""
                partial.append(Incomplete(step, name, f"no COMMITTED marker (partial write{ranks})"))
                continue
            with self._io(f"reading {name}/{MARKER}"):
                try:
                    raw = self.backend.get(f"{name}/{MARKER}")
                except BlobNotFound:
                    partial.append(Incomplete(step, name, "COMMITTED marker vanished"))
                    continue
            try:
                done.append(parse_marker(self.uri, name, step, raw))
            except CheckpointCorrupt as exc:
                partial.append(Incomplete(step, name, exc.message))
        done.sort(key=lambda c: (c.step, c.created))
        partial.sort(key=lambda i: (i.step, i.name))
        return done, partial

    def list(self) -> list[Checkpoint]:
        """Committed checkpoints, oldest first (checksums not verified). Raises: StorageError."""
        return self.scan()[0]

    def latest(self, *, verify: bool = True) -> Checkpoint | None:
        """The newest complete checkpoint, or None. With ``verify`` every payload sha256 is checked.

        Logs a warning naming each newer partial or corrupt checkpoint that was skipped.
        Raises: StorageError when the backend fails (a corrupt checkpoint is skipped, not raised).
        """
        found = self._newest(verify=verify, load=False)
        return found[0] if found else None

    def load_latest(self) -> tuple[Checkpoint, dict[str, bytes]] | None:
        """Like :meth:`latest` then :meth:`load`, reading each payload once. Raises: StorageError."""
        found: tuple[Checkpoint, dict[str, bytes]] | None = self._newest(verify=True, load=True)
        return found

    def get(self, step: int) -> Checkpoint:
        """The newest complete checkpoint for ``step`` (verified).

        Raises: CheckpointNotFound when no complete checkpoint holds that step; StorageError.
        """
        for ckpt in reversed(self.list()):
            if ckpt.step == step:
                try:
                    self.load(ckpt)
                except CheckpointCorrupt as exc:
                    log.warning("skipping corrupt checkpoint %s: %s", ckpt.uri, exc.message)
                    continue
                return ckpt
        raise CheckpointNotFound(
            f"no complete checkpoint for step {step} under {self.uri}",
            remediation="call latest() to resume from the newest complete checkpoint instead",
            uri=self.uri, step=step,
        )

    def load(self, ckpt: Checkpoint, *, verify: bool = True) -> dict[str, bytes]:
        """Read every payload file of ``ckpt``.

        Raises:
            CheckpointCorrupt: a payload file is missing or its sha256 differs from the marker.
            StorageError: the backend failed.
        """
        out: dict[str, bytes] = {}
        for fname, digest in ckpt.files.items():
            with self._io(f"reading {ckpt.name}/{fname}"):
                try:
                    data = self.backend.get(f"{ckpt.name}/{fname}")
                except BlobNotFound:
                    raise CheckpointCorrupt(
                        f"checkpoint {ckpt.uri} is missing payload file {fname!r}",
                        remediation="resume from an older checkpoint (latest() skips this one)",
                        uri=ckpt.uri, file=fname,
                    ) from None
            if verify and hashlib.sha256(data).hexdigest() != digest:
                raise CheckpointCorrupt(
                    f"checkpoint {ckpt.uri}: sha256 of {fname!r} does not match its COMMITTED marker",
                    remediation="resume from an older checkpoint (latest() skips this one)",
                    uri=ckpt.uri, file=fname,
                )
            out[fname] = data
        return out

    def _newest(self, *, verify: bool, load: bool) -> Any:
        done, partial = self.scan()
        skipped: list[tuple[int, str, str]] = [(i.step, i.name, i.reason) for i in partial]
        result: Any = None
        for ckpt in reversed(done):
            try:
                payload = self.load(ckpt) if (verify or load) else {}
            except CheckpointCorrupt as exc:
                skipped.append((ckpt.step, ckpt.name, exc.message))
                continue
            result = (ckpt, payload) if load else (ckpt,)
            break
        floor = result[0].step if result else -1
        for step, name, reason in sorted(skipped):
            if step >= floor and not (result and name == result[0].name):
                log.warning("skipping checkpoint %s: %s", self._uri(name), reason)
        return result

    # ---- housekeeping --------------------------------------------------------------------------------

    def prune(self, keep: int) -> builtins.list[str]:
        """Keep the ``keep`` newest complete (verified) checkpoints; delete every checkpoint and attempt
        older than the oldest kept one. Newer attempts are left alone (they may be in progress).

        Returns the deleted names. Raises: ValueError if ``keep`` < 1; StorageError.
        """
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        done, partial = self.scan()
        kept: _Checkpoints = []
        for ckpt in reversed(done):
            if len(kept) == keep:
                break
            try:
                self.load(ckpt)
                kept.append(ckpt)
            except CheckpointCorrupt:
                continue
        if len(kept) < keep:
            return []
        oldest = kept[-1]
        kept_names = {c.name for c in kept}
        victims = [c.name for c in done if c.name not in kept_names and (c.step, c.created) < (oldest.step,
                   oldest.created)]
        victims += [i.name for i in partial if i.step < oldest.step]
        for name in victims:
            with self._io(f"deleting {name}"):
                self.backend.delete_prefix(name)
        if victims:
            log.info("pruned %d checkpoint(s) under %s: %s", len(victims), self.uri, ", ".join(victims))
        return victims

    # ---- helpers -------------------------------------------------------------------------------------

    def _uri(self, name: str) -> str:
        return f"{self.uri}/{name}"

    @contextlib.contextmanager
    def _io(self, what: str) -> Iterator[None]:
        try:
            yield
        except (CheckpointError, BlobNotFound):
            raise
        except Exception as exc:
            raise _storage_error(self.uri, what, exc) from exc


def _storage_error(uri: str, what: str, exc: BaseException) -> StorageError:
    return StorageError(
        f"checkpoint storage {uri}: {what} failed: {type(exc).__name__}: {exc}",
        remediation=credentials_hint(uri), uri=uri,
    )
