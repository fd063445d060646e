"""Tiny local HTTP stand-ins (threaded http.server on 127.0.0.1) for the KFP v2beta1 API, Vertex AI
pipelineJobs and GKE clusters.get. They record every request so tests can check the real shapes."""

from __future__ import annotations

import email
import email.policy
import json
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Req:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"{}")

    def multipart(self) -> dict[str, tuple[str | None, bytes]]:
        """field name -> (filename, content)."""
        ct = self.headers.get("content-type", "")
        msg = email.message_from_bytes(
            b"Content-Type: " + ct.encode() + b"\r\n\r\n" + self.body, policy=email.policy.HTTP
        )
        out: dict[str, tuple[str | None, bytes]] = {}
        for part in msg.iter_parts():  # type: ignore[attr-defined]
            name = part.get_param("name", header="content-disposition")
            out[str(name)] = (part.get_filename(), part.get_payload(decode=True))
        return out


Handler = Callable[[Req], tuple[int, Any]]


@dataclass
class StandIn:
    routes: list[tuple[str, str, Handler]] = field(default_factory=list)  # (method, path prefix, fn)
    requests: list[Req] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def route(self, method: str, path: str, fn: Handler) -> None:
        self.routes.append((method, path, fn))

    def start(self) -> StandIn:
        standin = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _serve(self) -> None:
                parsed = urllib.parse.urlsplit(self.path)
                n = int(self.headers.get("content-length") or 0)
                req = Req(self.command, parsed.path, urllib.parse.parse_qs(parsed.query),
                          {k.lower(): v for k, v in self.headers.items()}, self.rfile.read(n) if n else b"")
                standin.requests.append(req)
                for method, prefix, fn in standin.routes:
                    if method == self.command and (parsed.path == prefix or
                                                   (prefix.endswith("*") and parsed.path.startswith(prefix[:-1]))):
                        status, body = fn(req)
                        break
                else:
                    status, body = 404, {"error": {"code": 404, "status": "NOT_FOUND",
                                                   "message": f"no route {self.command} {parsed.path}"}}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PATCH = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()

    def calls(self, method: str, path_prefix: str) -> list[Req]:
        return [r for r in self.requests if r.method == method and r.path.startswith(path_prefix)]


class FakeKfp:
    """The subset of the KFP v2beta1 REST API that kfp.Client uses to upload and run."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self.pipelines: dict[str, dict[str, Any]] = {}
        self.versions: dict[str, list[dict[str, Any]]] = {}
        self.experiments: dict[str, dict[str, Any]] = {}
        self.runs: list[dict[str, Any]] = []
        self.http = StandIn()
        a = "/apis/v2beta1"
        for method, path, fn in (
            ("GET", f"{a}/healthz", lambda r: (200, {"multi_user": False})),
            ("POST", f"{a}/pipelines/upload_version", self._upload_version),
            ("POST", f"{a}/pipelines/upload", self._upload),
            ("GET", f"{a}/pipelines/*", self._versions),
            ("GET", f"{a}/pipelines", self._list_pipelines),
            ("GET", f"{a}/experiments", self._list_experiments),
            ("POST", f"{a}/experiments", self._create_experiment),
            ("POST", f"{a}/runs", self._create_run),
        ):
            self.http.route(method, path, self._auth(fn))

    def _auth(self, fn: Handler) -> Handler:
        def wrapped(req: Req) -> tuple[int, Any]:
            if self.token and req.headers.get("authorization") != f"Bearer {self.token}":
                return 401, {"error": "Unauthenticated", "code": 16}
            return fn(req)
        return wrapped

    @staticmethod
    def _filter_name(req: Req) -> str | None:
        flt = req.query.get("filter")
        if not flt:
            return None
        preds = json.loads(flt[0])["predicates"]
        return str(preds[0]["string_value"] if "string_value" in preds[0] else preds[0]["stringValue"])

    def _list_pipelines(self, req: Req) -> tuple[int, Any]:
        name = self._filter_name(req)
        found = [p for p in self.pipelines.values() if name is None or p["display_name"] == name]
        return 200, ({"pipelines": found, "total_size": len(found)} if found else {})

    def _new_version(self, pid: str, name: str, req: Req) -> dict[str, Any]:
        files = req.multipart()
        assert "uploadfile" in files, files.keys()
        v = {"pipeline_id": pid, "pipeline_version_id": f"ver-{sum(map(len, self.versions.values())) + 1}",
             "display_name": name, "created_at": "2026-01-01T00:00:00Z",
             "package": files["uploadfile"][1].decode()}
        self.versions.setdefault(pid, []).append(v)
        return v

    def _upload(self, req: Req) -> tuple[int, Any]:
        name = req.query["name"][0]
        if any(p["display_name"] == name for p in self.pipelines.values()):
            return 409, {"error": "already exists"}
        pid = f"pipe-{len(self.pipelines) + 1}"
        self.pipelines[pid] = {"pipeline_id": pid, "display_name": name, "created_at": "2026-01-01T00:00:00Z"}
        self._new_version(pid, name, req)
        return 200, self.pipelines[pid]

    def _upload_version(self, req: Req) -> tuple[int, Any]:
        pid = req.query["pipelineid"][0]
        if pid not in self.pipelines:
            return 404, {"error": "no pipeline"}
        v = self._new_version(pid, req.query["name"][0], req)
        return 200, {k: v[k] for k in ("pipeline_id", "pipeline_version_id", "display_name")}

    def _versions(self, req: Req) -> tuple[int, Any]:
        pid = req.path.split("/")[4]
        vs = list(reversed(self.versions.get(pid, [])))
        return 200, {"pipeline_versions": [{k: v[k] for k in ("pipeline_id", "pipeline_version_id",
                                                              "display_name")} for v in vs[:1]],
                     "total_size": len(vs)}

    def _list_experiments(self, req: Req) -> tuple[int, Any]:
        name = self._filter_name(req)
        found = [e for e in self.experiments.values() if e["display_name"] == name]
        return 200, ({"experiments": found} if found else {})

    def _create_experiment(self, req: Req) -> tuple[int, Any]:
        body = req.json()
        eid = f"exp-{len(self.experiments) + 1}"
        self.experiments[eid] = {"experiment_id": eid, "display_name": body["display_name"]}
        return 200, self.experiments[eid]

    def _create_run(self, req: Req) -> tuple[int, Any]:
        body = req.json()
        run = {**body, "run_id": f"run-{len(self.runs) + 1}", "state": "PENDING"}
        self.runs.append(run)
        return 200, run
