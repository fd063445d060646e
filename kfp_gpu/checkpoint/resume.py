"""Where to resume from: the newest complete checkpoint of any format a trainer writes under ``checkpoint_uri``.

Recognised formats, each one small reader with its completeness rule (:mod:`kfp_gpu.checkpoint.formats`):
kfp-gpu's own ``step-N/`` directories, torch.distributed.checkpoint (DCP) directories, Hugging Face Trainer
``checkpoint-<step>/`` directories and Lightning ``.ckpt`` files. :func:`find` lists the store root once, asks
every reader, and walks the candidates newest first; a checkpoint that turns out partial is skipped with a
warning naming its path and the missing piece. Readers only list and make small reads (markers, JSON files,
zip directories); nothing here imports torch.

The launcher hands the choice to the job two ways::

    found = resume.find(spec.checkpoint_uri)
    env = found.env() if found else resume.fresh_env(spec.checkpoint_uri)      # KFP_GPU_* variables
    args = [*template.args, *(found.args(template.resume_args) if found else [])]  # --resume_from_checkpoint ...
"""

from __future__ import annotations

import logging
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kfp_gpu.checkpoint.backends import Backend, open_backend
from kfp_gpu.checkpoint.env import CHECKPOINT_URI_ENV, RESUME_STEP_ENV
from kfp_gpu.checkpoint.errors import StorageError
from kfp_gpu.checkpoint.formats import READERS
from kfp_gpu.checkpoint.formats.base import Candidate, Listing, Partial
from kfp_gpu.errors import InvalidSpec

log = logging.getLogger("kfp_gpu.checkpoint")

RESUME_PATH_ENV = "KFP_GPU_RESUME_PATH"
RESUME_FORMAT_ENV = "KFP_GPU_RESUME_FORMAT"
_warned: set[tuple[str, str]] = set()  # (path, missing) already logged at WARNING by this process
#: what a ``resume_args`` entry may name: ``"{path}"`` (the checkpoint's path / URI), ``"{step}"``, ``"{format}"``,
#: ``"{name}"`` (its key under the root: ``"/mnt/ckpt/{name}"`` where the pod mounts the bucket, e.g. GCS FUSE)
ARG_FIELDS = ("path", "step", "format", "name")


@dataclass(frozen=True)
class Resume:
    """The checkpoint a (re)started job resumes from.

    Attributes:
        step: the training step it holds.
        path: its full path / URI (a directory; a file for Lightning), what ``--resume_from_checkpoint`` takes.
        format: the reader that recognised it: ``kfp-gpu``, ``dcp``, ``hf-trainer`` or ``lightning``.
        created: commit or modification time (Unix s; 0.0 when the store cannot tell).
        root: the store root (``checkpoint_uri``) it was found under.
        name: its key under ``root``.
        meta: what the format records cheaply (kfp-gpu: the marker's meta, e.g. ``loss``).
    """

    step: int
    path: str
    format: str
    created: float
    root: str = ""
    name: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def uri(self) -> str:
        """Same as ``path`` (the name the train step's ledger uses)."""
        return self.path

    def env(self) -> dict[str, str]:
        """The variables a resumed job gets: ``KFP_GPU_CHECKPOINT_URI`` (the root), ``KFP_GPU_RESUME_STEP``,
        ``KFP_GPU_RESUME_PATH`` and ``KFP_GPU_RESUME_FORMAT``."""
        return {CHECKPOINT_URI_ENV: self.root, RESUME_STEP_ENV: str(self.step), RESUME_PATH_ENV: self.path,
                RESUME_FORMAT_ENV: self.format}

    def args(self, template: Sequence[str]) -> list[str]:
        """``template`` (a JobTemplate's ``resume_args``) with ``{path}``, ``{step}``, ``{format}``, ``{name}`` filled in.

        Raises: InvalidSpec when an entry names another field (``check_args`` catches that at decoration time).
        """
        check_args("train.resume_args", template)
        return [a.format(path=self.path, step=self.step, format=self.format, name=self.name) for a in template]


def fresh_env(root: str) -> dict[str, str]:
    """The variables of a job that starts from scratch (no checkpoint yet): the root and step 0 (no path, no format)."""
    return {CHECKPOINT_URI_ENV: root, RESUME_STEP_ENV: "0"}


def check_args(where: str, template: Sequence[Any]) -> None:
    """Validate a ``resume_args`` template: strings whose ``{...}`` fields are ``path``, ``step``, ``format``, ``name``.

    Raises: InvalidSpec naming the entry, its value and the fields allowed.
    """
    fix = "e.g. resume_args=('--resume_from_checkpoint', '{path}')"
    for i, arg in enumerate(template):
        if not isinstance(arg, str):
            raise InvalidSpec(f"{where}[{i}]", arg, "must be a string such as '--resume_from_checkpoint' or '{path}'",
                              remediation=fix)
        try:
            names = [f for _, f, _, _ in string.Formatter().parse(arg) if f is not None]
        except ValueError as exc:
            raise InvalidSpec(f"{where}[{i}]", arg, f"is not a valid template ({exc}); write '{{{{' for a "
                              "literal brace", remediation=fix) from None
        bad = [n for n in names if n not in ARG_FIELDS]
        if bad:
            raise InvalidSpec(f"{where}[{i}]", arg, f"names {{{bad[0]}}}; allowed: "
                              + ", ".join(f"{{{n}}}" for n in ARG_FIELDS), remediation=fix)


def scan(uri: str, *, backend: Backend | None = None) -> tuple[list[Candidate], list[Partial]]:
    """Every format's candidates (oldest first) and partials under ``uri``, from one listing.

    Raises: StorageUnavailable (SDK missing), StorageError (listing or a small read failed).
    """
    be = backend if backend is not None else open_backend(uri)
    try:
        keys = be.list()
    except Exception as exc:
        raise StorageError(f"checkpoint storage {uri}: listing failed: {type(exc).__name__}: {exc}",
                           uri=uri) from exc
    listing = Listing(be, keys)
    cands: list[Candidate] = []
    partials: list[Partial] = []
    for reader in READERS:
        c, p = reader.scan(listing)
        cands += c
        partials += p
    order = {r.NAME: i for i, r in enumerate(READERS)}
    cands.sort(key=lambda c: (c.step, c.created, -order.get(c.format, 0)))
    partials.sort(key=lambda p: (p.step, p.name))
    return cands, partials


def find(uri: str, *, backend: Backend | None = None) -> Resume | None:
    """The newest complete checkpoint of any recognised format under ``uri``, or None (a fresh start).

    Walks candidates newest first and runs each one's check (small reads); logs a ``WARNING`` on the
    ``kfp_gpu.checkpoint`` logger for each checkpoint newer than the one chosen that it skipped, naming its
    path, format and the missing piece (once per process for the same path and piece; later at DEBUG).

    Raises: StorageUnavailable (SDK missing), StorageError (listing or a read failed).
    """
    be = backend if backend is not None else open_backend(uri)
    root = be.uri.rstrip("/") or be.uri
    cands, partials = scan(uri, backend=be)
    skipped = [(p.step, p.name, p.format, p.missing) for p in partials]
    chosen: Candidate | None = None
    for cand in reversed(cands):
        try:
            missing = cand.check()
        except StorageError:
            raise
        except Exception as exc:  # a reader's small read failed: the store is unwell, not the checkpoint
            raise StorageError(f"checkpoint storage {root}: reading {cand.name} failed: {type(exc).__name__}: "
                               f"{exc}", uri=root) from exc
        if missing is None:
            chosen = cand
            break
        skipped.append((cand.step, cand.name, cand.format, missing))
    floor = chosen.step if chosen else -1
    for step, name, fmt, missing in sorted(skipped):
        if step >= floor and not (chosen and name == chosen.name):
            seen = (_join(root, name), missing)
            if len(_warned) > 10_000:
                _warned.clear()
            level = logging.DEBUG if seen in _warned else logging.WARNING  # the train step asks again and again
            _warned.add(seen)
            log.log(level, "skipping partial %s checkpoint %s: %s", fmt, seen[0], missing)
    if chosen is None:
        return None
    return Resume(chosen.step, _join(root, chosen.name), chosen.format, chosen.created, root, chosen.name,
                  dict(chosen.meta))


def _join(root: str, name: str) -> str:
    return f"{root}/{name}" if name else root
