"""Lightning ``.ckpt`` files (``ModelCheckpoint``: ``epoch=0-step=120.ckpt``, ``last.ckpt``).

A ``.ckpt`` is one ``torch.save`` zip archive; Lightning writes it whole (``_atomic_save``: serialised in memory,
then written in one fsspec transaction), but a local write can still be cut short. Completeness rule: the file
is a zip archive whose end-of-central-directory record is present (torch writes the zip directory last, when it
closes the archive), it holds ``<archive>/data.pkl`` (CRC-checked on read), and that pickle's top-level dict has
integer ``global_step`` and ``epoch`` keys. Only the zip directory and ``data.pkl`` are read, by ranged reads;
the pickle is read with a restricted unpickler that builds no tensors and imports nothing (every class becomes
an inert stub), so neither torch nor Lightning is needed. ``global_step`` is the checkpoint's step. A ``.ckpt``
*directory* (Lightning's sharded FSDP / DeepSpeed strategies) is left to the DCP reader.
"""

from __future__ import annotations

import collections
import io
import pickle
import re
import sys
import zipfile
from typing import Any

from kfp_gpu.checkpoint.backends import Backend, BlobNotFound
from kfp_gpu.checkpoint.formats.base import Candidate, Listing, Partial, modified, read_range, size_of

NAME = "lightning"
SUFFIX = ".ckpt"
_STEP_RE = re.compile(r"step=(\d+)")
_BLOCK = 64 * 1024


def scan(listing: Listing) -> tuple[list[Candidate], list[Partial]]:
    """Every ``.ckpt`` file outside directories other readers claimed, each read (zip directory + data.pkl).

    Raises: the backend's errors when a read fails for another reason than a missing object.
    """
    out: list[Candidate] = []
    partial: list[Partial] = []
    ckpt_dirs = {k.rsplit("/", 1)[0] for k in listing.keys if "/" in k}
    for key in listing.keys:
        if not key.endswith(SUFFIX) or not listing.free(key) or key in ckpt_dirs:
            continue
        named = _STEP_RE.search(key.rsplit("/", 1)[-1])
        try:
            step, missing = read_header(listing.backend, key)
        except BlobNotFound:
            continue  # deleted since the listing (ModelCheckpoint's top-k rotation)
        if missing is not None or step is None:
            guess = int(named.group(1)) if named else sys.maxsize
            partial.append(Partial(NAME, guess, key, missing or "no global_step"))
            continue
        out.append(Candidate(NAME, step, key, modified(listing.backend, key), _ok))
    return out, partial


def _ok() -> None:
    return None


def read_header(backend: Backend, key: str) -> tuple[int | None, str | None]:
    """``(global_step, None)`` for a complete ``.ckpt``, else ``(None, the missing piece)``.

    Raises: BlobNotFound when the file is gone; the backend's own errors.
    """
    size = size_of(backend, key)
    try:
        with zipfile.ZipFile(_RangeFile(backend, key, size)) as zf:
            pkl = [n for n in zf.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if not pkl:
                return None, "no data.pkl in the archive (not a torch.save zip archive)"
            raw = zf.read(pkl[0])
    except zipfile.BadZipFile as exc:
        return None, f"not a complete zip archive ({exc}: truncated, or an interrupted save)"
    try:
        top = _Unpickler(io.BytesIO(raw)).load()
    except Exception as exc:  # noqa: BLE001 - any failure means the pickle is unusable
        return None, f"data.pkl does not unpickle ({type(exc).__name__}: {exc})"
    if not isinstance(top, dict):
        return None, "data.pkl holds no checkpoint dict"
    absent = [k for k in ("global_step", "epoch") if not isinstance(top.get(k), int)]
    if absent:
        return None, f"no integer {absent[0]!r} key (not a Lightning checkpoint)"
    return int(top["global_step"]), None


class _Stub(dict):  # type: ignore[type-arg]
    """Stands for any class or function the pickle names: accepts every call, item and state, holds nothing."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Stub:
        return dict.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        dict.__init__(self)

    def __call__(self, *args: Any, **kwargs: Any) -> _Stub:
        return _Stub()

    def __setstate__(self, state: Any) -> None:
        return None

    def append(self, item: Any) -> None:
        return None

    def extend(self, items: Any) -> None:
        return None


_SAFE = {("collections", "OrderedDict"): collections.OrderedDict, ("builtins", "set"): set,
         ("builtins", "frozenset"): frozenset, ("builtins", "list"): list, ("builtins", "dict"): dict,
         ("builtins", "tuple"): tuple, ("builtins", "int"): int, ("builtins", "float"): float}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _SAFE.get((module, name), _Stub)

    def persistent_load(self, pid: Any) -> Any:
        return None  # a tensor's storage: never read


class _RangeFile(io.RawIOBase):
    """A read-only seekable view of one object, fetched in 64 KiB blocks by ranged reads."""

    def __init__(self, backend: Backend, key: str, size: int) -> None:
        self._backend, self._key, self._size, self._pos = backend, key, size, 0
        self._blocks: dict[int, bytes] = {}

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buf: Any) -> int:
        view = memoryview(buf).cast("B")
        want = min(len(view), max(0, self._size - self._pos))
        got = 0
        while got < want:
            block, skip = divmod(self._pos + got, _BLOCK)
            data = self._block(block)[skip:]
            n = min(len(data), want - got)
            if n <= 0:
                break
            view[got:got + n] = data[:n]
            got += n
        self._pos += got
        return got

    def _block(self, i: int) -> bytes:
        if i not in self._blocks:
            start = i * _BLOCK
            self._blocks[i] = read_range(self._backend, self._key, start, min(self._size, start + _BLOCK))
        return self._blocks[i]
