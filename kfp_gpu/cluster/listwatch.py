"""The one list -> watch -> relist loop: a background Kubernetes watch handing raw JSON events to a callback.

A :class:`Watcher` lists once (emitting the current objects as ``SYNC`` events, so a consumer starts from the
real state) unless it is given the resourceVersion of a list its caller already made, then follows a watch
stream from that resourceVersion, resuming from the last version seen when a stream window ends or the
connection drops, and re-listing (``SYNC`` again) when the version expired (HTTP 410 Gone). Every event carries
the wall-clock time it was *received*, which is what detection-latency metrics are measured against.

Objects stay the API server's JSON dicts: the list is read with ``_preload_content=False`` and the stream is
opened through a function without a docstring, so ``kubernetes.watch`` finds no return type and never builds
model objects (the client builds a ``Configuration`` per model it deserialises, which made a 64-node list +
watch cost over a second of CPU).

A refusal (401/403) does not heal by retrying: it is emitted once as an ``ERROR`` event (``obj["error"]`` is
the ``ApiException``) and the loop ends. Other API errors and dropped connections are retried with backoff
(0.2 s doubling to 5 s). ``stop()`` never blocks: the daemon thread ends at the next event or window end.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from kfp_gpu.cluster.apierrors import Permanent, Transient, classify

log = logging.getLogger(__name__)

SYNC = "SYNC"  # the object as a (re)list returned it
ERROR = "ERROR"  # the watch was refused (401/403); ``obj["error"]`` is the ApiException


@dataclass(frozen=True)
class Event:
    source: str  # "node" | "pod" | "job" | "<watcher name>"
    type: str  # ADDED | MODIFIED | DELETED | SYNC | ERROR
    obj: dict[str, Any]
    at: float  # unix seconds when the event was received


ListFn = Callable[..., Any]
EmitFn = Callable[[Event], Any]
RelistFn = Callable[[], tuple[list[dict[str, Any]], str]]  # -> (items, resourceVersion), for lists done elsewhere


class Watcher:
    """One list+watch loop in a daemon thread, calling ``emit(event)`` for every :class:`Event`.

    ``list_fn`` is a kubernetes list call (``CoreV1Api.list_node``, ``CustomObjectsApi.list_namespaced_
    custom_object``...); ``args``/``kwargs`` are passed to it (selectors, namespace...). ``since``: the
    resourceVersion of a list the caller already made (and applied), so the loop starts watching without
    listing again; ``synced`` is set once the first list was emitted (at once with ``since``). ``relist``
    replaces the list call for (re)lists (same objects, e.g. a helper that already lists raw JSON). ``emit`` runs on
    the watch thread: it must be quick and thread-safe (``queue.Queue.put``, a locked update).
    """

    def __init__(
        self, source: str, list_fn: ListFn, emit: EmitFn, *args: Any, window_s: int = 30, since: str = "",
        relist: RelistFn | None = None, **kwargs: Any,
    ) -> None:
        self.source = source
        self._list = list_fn
        self._emit = emit
        self._args = args
        self._kwargs = kwargs
        self._window_s = window_s
        self._since = since
        self._relist_fn = relist
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self.synced = threading.Event()
        if since:
            self.synced.set()
        self._thread = threading.Thread(target=self._run, name=f"kfp-gpu-watch-{source}", daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the loop to end; it does at the next event or window end (daemon thread, never blocks)."""
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def _relist(self) -> str:
        if self._relist_fn is not None:
            items, rv = self._relist_fn()
        else:
            body = json.loads(self._list(*self._args, **self._kwargs, _preload_content=False).data)
            items, rv = body.get("items") or [], str((body.get("metadata") or {}).get("resourceVersion", ""))
        now = time.time()
        for item in items:
            self._emit(Event(self.source, SYNC, item, now))
        self.synced.set()
        return rv

    def _run(self) -> None:
        list_fn = self._list

        def raw(*args: Any, **kwargs: Any) -> Any:  # no docstring: the stream then yields plain dicts
            return list_fn(*args, **kwargs)

        rv = self._since
        backoff = 0.2
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._relist()
                self._watch = watch.Watch()
                if self._stop.is_set():  # stop() came before this Watch existed
                    return
                for ev in self._watch.stream(
                    raw, *self._args, resource_version=rv, timeout_seconds=self._window_s,
                    allow_watch_bookmarks=True, **self._kwargs,
                ):
                    obj = ev.get("raw_object") or {}
                    rv = str((obj.get("metadata") or {}).get("resourceVersion", "")) or rv
                    if ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self._emit(Event(self.source, str(ev["type"]), obj, time.time()))
                    if self._stop.is_set():
                        return
                backoff = 0.2
            except ApiException as exc:
                if self._stop.is_set():
                    return
                if exc.status == 410:
                    rv = ""  # expired: list again from the current state
                    continue
                verdict = classify(exc)
                if isinstance(verdict, Permanent) and verdict.status in (401, 403):
                    # a refusal does not heal by retrying: hand it to the consumer
                    self._emit(Event(self.source, ERROR, {"error": exc}, time.time()))
                    self.synced.set()
                    return
                log.warning("watch %s failed (%s); retrying", self.source, exc.status)
                floor = verdict.retry_after_s if isinstance(verdict, Transient) else None
                self._stop.wait(max(backoff, floor or 0.0))  # never before the server's Retry-After
                backoff = min(backoff * 2, 5.0)
            except Exception as exc:  # connection dropped: resume from the last resourceVersion seen
                if self._stop.is_set():
                    return
                log.warning("watch %s interrupted (%s); resuming", self.source, exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
