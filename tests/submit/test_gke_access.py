from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials, Credentials

from kfp_gpu.errors import InvalidSpec, NotFound, PermissionDenied
from kfp_gpu.submit.gke_access import gke_api_client, gke_configuration
from tests.submit.standins import Req, StandIn

PEM = b"-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
PATH = "/v1/projects/p/locations/l/clusters/c"


class CountingCredentials(Credentials):  # type: ignore[misc]
    """Mints tok-1, tok-2... each refresh, valid for 1 hour (or already expired when ``expired``)."""

    def __init__(self, *, short_lived: bool = False) -> None:
        super().__init__()
        self.n = 0
        self.short_lived = short_lived

    def refresh(self, request: Any) -> None:
        self.n += 1
        self.token = f"tok-{self.n}"
        life = dt.timedelta(seconds=-1 if self.short_lived else 3600)
        self.expiry = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) + life


@pytest.fixture
def gke() -> Iterator[StandIn]:
    s = StandIn()

    def get_cluster(req: Req) -> tuple[int, Any]:
        return 200, {
            "name": "c", "status": "RUNNING", "endpoint": "34.1.2.3",
            "masterAuth": {"clusterCaCertificate": base64.b64encode(PEM).decode()},
            "privateClusterConfig": {"privateEndpoint": "10.0.0.2"},
            "controlPlaneEndpointsConfig": {"dnsEndpointConfig": {"endpoint": "gke-abc.us-central1.gke.goog"}},
        }

    s.route("GET", PATH, get_cluster)
    s.route("GET", "/v1/projects/p/locations/l/clusters/denied",
            lambda r: (403, {"error": {"code": 403, "message": "no container.clusters.get",
                                       "status": "PERMISSION_DENIED"}}))
    s.start()
    yield s
    s.stop()


def test_public_endpoint_ca_and_anonymous(gke: StandIn) -> None:
    cfg = gke_configuration("p", "l", "c", credentials=AnonymousCredentials(), container_api_endpoint=gke.url)
    (req,) = gke.calls("GET", PATH)
    assert "authorization" not in req.headers
    assert cfg.host == "https://34.1.2.3"
    assert Path(cfg.ssl_ca_cert).read_bytes() == PEM
    assert Path(cfg.ssl_ca_cert).stat().st_mode & 0o077 == 0
    assert cfg.verify_ssl is True
    assert "authorization" not in cfg.api_key


def test_token_attached_and_refreshed(gke: StandIn) -> None:
    creds = CountingCredentials()
    client = gke_api_client("p", "l", "c", credentials=creds, container_api_endpoint=gke.url,
                            endpoint="private")
    cfg = client.configuration
    assert cfg.host == "https://10.0.0.2"
    assert gke.calls("GET", PATH)[0].headers["authorization"].startswith("Bearer tok-")
    n = creds.n
    assert cfg.get_api_key_with_prefix("authorization") == f"Bearer tok-{n}"  # still valid: no refresh
    short = CountingCredentials(short_lived=True)
    cfg2 = gke_configuration("p", "l", "c", credentials=short, container_api_endpoint=gke.url)
    first = cfg2.get_api_key_with_prefix("authorization")
    second = cfg2.get_api_key_with_prefix("authorization")
    assert first != second and second.startswith("Bearer tok-")  # expired token -> refreshed per request


def test_dns_endpoint_uses_system_trust(gke: StandIn) -> None:
    cfg = gke_configuration("p", "l", "c", credentials=AnonymousCredentials(), container_api_endpoint=gke.url,
                            endpoint="dns")
    assert cfg.host == "https://gke-abc.us-central1.gke.goog" and cfg.ssl_ca_cert is None


def test_errors(gke: StandIn) -> None:
    with pytest.raises(PermissionDenied) as ei:
        gke_configuration("p", "l", "denied", credentials=AnonymousCredentials(), container_api_endpoint=gke.url)
    assert "container.clusters.get" in ei.value.message and "clusterViewer" in ei.value.remediation
    with pytest.raises(NotFound):
        gke_configuration("p", "l", "missing", credentials=AnonymousCredentials(), container_api_endpoint=gke.url)
    with pytest.raises(InvalidSpec) as e2:
        gke_configuration("p", "", "c", credentials=AnonymousCredentials())
    assert e2.value.field == "location"
