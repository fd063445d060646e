"""The ``gcs`` fixtures: the real GCS emulator (fake-gcs-server) of the dev cluster, a fresh bucket per test.

``gcs_emulator`` session fixture: starts (or re-uses) the emulator (:func:`kfp_gpu_rehearsal.devcluster.gcs_profile.ensure_up`;
               the control plane is not needed); its URL. FAILS (never skips) when the binary is missing or it
               cannot start.
``gcs``        a fresh bucket per test, with ``STORAGE_EMULATOR_HOST`` set for the test (and ``.env`` for the
               subprocesses it starts); the bucket and its objects are deleted afterwards.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kfp_gpu.checkpoint.backends import EMULATOR_ENV, gcs_client
from kfp_gpu_rehearsal.devcluster import gcs_profile
from tests.tiers import require_integration


@dataclass(frozen=True)
class GcsBucket:
    url: str  # the emulator, http://127.0.0.1:<port>
    bucket: str
    client: Any  # google.cloud.storage.Client pointed at the emulator

    @property
    def env(self) -> dict[str, str]:
        """The environment a trainer process needs to reach this bucket."""
        return {EMULATOR_ENV: self.url}

    def uri(self, prefix: str = "") -> str:
        return f"gs://{self.bucket}/{prefix.strip('/')}".rstrip("/")

    def keys(self, prefix: str = "") -> list[str]:
        return sorted(b.name for b in self.client.list_blobs(self.bucket, prefix=prefix))


@pytest.fixture(scope="session")
def gcs_emulator(request: pytest.FixtureRequest) -> str:
    require_integration(request, "the GCS emulator (gcs_emulator)")
    try:
        return gcs_profile.ensure_up()
    except Exception as e:  # noqa: BLE001 - a missing emulator must fail loudly, never skip
        pytest.fail(f"GCS emulator (fake-gcs-server) failed to start (make cluster-build GCS=1, "
                    f"python -m kfp_gpu_rehearsal.devcluster.gcs build): {e}", pytrace=False)


@pytest.fixture
def gcs(gcs_emulator: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[GcsBucket]:
    monkeypatch.setenv(EMULATOR_ENV, gcs_emulator)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    slug = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{slug}-{uuid.uuid4().hex[:8]}"
    client = gcs_client()
    client.create_bucket(name)
    yield GcsBucket(gcs_emulator, name, client)
    bucket = client.bucket(name)
    for blob in list(client.list_blobs(name)):
        blob.delete()
    bucket.delete()
