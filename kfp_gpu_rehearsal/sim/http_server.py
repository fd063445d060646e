"""The stand-in's HTTP transport: one threaded listener whose handler parses a request and answers in JSON.

Contract: every request becomes ``SimServer.handle(method, path, query, body)``; before it, paths outside ``/sim/``
wait the scenario's ``api_latency_ms`` and pass the principal's authorization check (Google authenticates and
authorizes before anything else). A :class:`~kfp_gpu_rehearsal.sim.shapes.SimHttpError` is answered as Google
would (status, error body, headers such as ``Retry-After``); malformed JSON is a 400; a stand-in bug is a 500,
never a dropped connection. Routing and the world are :mod:`kfp_gpu_rehearsal.sim.server`'s.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from kfp_gpu_rehearsal.sim.shapes import SimHttpError, http_error

if TYPE_CHECKING:
    from kfp_gpu_rehearsal.sim.server import SimServer

__all__ = ["SimHttpServer"]

log = logging.getLogger("kfp_gpu_rehearsal.sim.server")


class _Handler(BaseHTTPRequestHandler):
    server: SimHttpServer
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: the headers and the body go out as two writes; with Nagle on, the body waited for the client's
    # delayed ACK of the headers (40 ms on Linux) on a reused connection, a stall no Google front end adds.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:  # noqa: N802
        self._dispatch("PATCH")

    def _dispatch(self, method: str) -> None:
        sim = self.server.sim
        parsed = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(parsed.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(parsed.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not path.startswith("/sim/") and sim.state.scenario.api_latency_ms:
            time.sleep(sim.state.scenario.api_latency_ms / 1000.0)
        headers: dict[str, str] = {}
        try:
            if not path.startswith("/sim/"):  # Google authenticates and authorizes before anything else
                sim.principals.check(method, path, self.headers.get("Authorization", ""))
            body = json.loads(raw) if raw.strip() else {}
            status, payload = sim.handle(method, path, query, body if isinstance(body, dict) else {})
        except SimHttpError as exc:
            status, payload, headers = exc.status, exc.body, exc.headers
        except ValueError as exc:
            status, payload = 400, http_error(400, f"Invalid JSON payload received. {exc}").body
        except Exception as exc:  # noqa: BLE001 - a stand-in bug must still answer, as a 500
            log.exception("sim: %s %s failed", method, path)
            status, payload = 500, http_error(500, f"stand-in internal error: {exc!r}").body
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


class SimHttpServer(ThreadingHTTPServer):
    """The threaded listener of one :class:`~kfp_gpu_rehearsal.sim.server.SimServer` (``sim``)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, addr: tuple[str, int], sim: SimServer) -> None:
        super().__init__(addr, _Handler)
        self.sim = sim
