"""QuotaPreferences as Cloud Quotas accepts them: GkeProvider and the stand-in, through the real client."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import cloudquotas_v1
from google.protobuf import field_mask_pb2

from kfp_gpu import iam
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu_rehearsal.sim import SimServer
from kfp_gpu_rehearsal.sim.gcp_iam import QUOTA_TOKEN
from tests.sim._helpers import CLUSTER, PROJECT, REGION, client_kwargs, running

PARENT = f"projects/{PROJECT}/locations/global"
EMAIL = "ml-platform@example.com"
A100 = "NVIDIA-A100-80GB-GPUS-per-project-region"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _quota_requester(monkeypatch: pytest.MonkeyPatch) -> None:
    """Filing quota requests is the quota requester's (deploy/gcp-quota-requester-role.yaml), not the controller's."""
    monkeypatch.setenv(iam.SIM_GCP_TOKEN_ENV, QUOTA_TOKEN)


@pytest.fixture
def sim() -> Iterator[SimServer]:
    with running() as s:
        yield s


def _cq(sim: SimServer) -> cloudquotas_v1.CloudQuotasClient:
    return cloudquotas_v1.CloudQuotasClient(**client_kwargs(sim.url, QUOTA_TOKEN))


def _pref(value: int, email: str = EMAIL, quota_id: str = A100) -> cloudquotas_v1.QuotaPreference:
    return cloudquotas_v1.QuotaPreference(
        service="compute.googleapis.com", quota_id=quota_id, dimensions={"region": REGION},
        justification="training", contact_email=email, quota_config=cloudquotas_v1.QuotaConfig(preferred_value=value))


def test_create_with_contact_email_then_a_new_value_patches_the_same_preference(sim: SimServer) -> None:
    p = GkeProvider(PROJECT, REGION, CLUSTER, endpoint=sim.url, contact_email=EMAIL)
    name = p.request_quota_increase("NVIDIA_A100_80GB_GPUS", REGION, 256, "burst for run-42")
    first = _cq(sim).get_quota_preference(name=name)
    assert first.quota_config.preferred_value == 256 and not first.contact_email  # input only
    again = p.request_quota_increase("NVIDIA_A100_80GB_GPUS", REGION, 512, "more for run-43")
    assert again == name
    prefs = list(_cq(sim).list_quota_preferences(parent=PARENT))
    assert [x.name for x in prefs] == [name]
    assert prefs[0].quota_config.preferred_value == 512 and prefs[0].etag != first.etag
    assert prefs[0].justification == "more for run-43" and prefs[0].create_time == first.create_time
    assert p.request_quota_increase("NVIDIA_A100_80GB_GPUS", REGION, 512, "same") == name
    assert _cq(sim).get_quota_preference(name=name).etag == prefs[0].etag  # the same value writes nothing


def test_a_preference_made_elsewhere_is_read_and_patched(sim: SimServer) -> None:
    made = _cq(sim).create_quota_preference(parent=PARENT, quota_preference=_pref(200), quota_preference_id="console")
    p = GkeProvider(PROJECT, REGION, CLUSTER, endpoint=sim.url, contact_email=EMAIL)
    assert p.request_quota_increase("NVIDIA_A100_80GB_GPUS", REGION, 300, "x") == made.name
    (only,) = _cq(sim).list_quota_preferences(parent=PARENT)
    assert only.name == made.name and only.quota_config.preferred_value == 300


def test_create_of_an_existing_id_is_409_and_resolved_by_read_and_patch(
        sim: SimServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from kfp_gpu.providers.gke import preferences

    p = GkeProvider(PROJECT, REGION, CLUSTER, endpoint=sim.url, contact_email=EMAIL)
    name = p.request_quota_increase("NVIDIA_A100_80GB_GPUS", REGION, 256, "x")
    with pytest.raises(gexc.Conflict):
        _cq(sim).create_quota_preference(parent=PARENT, quota_preference=_pref(400),
                                         quota_preference_id=name.rsplit("/", 1)[1])
    # a race: another caller makes the preference between our read and our create -> 409 -> read + patch
    real_read, real_find = preferences._read, preferences._find
    seen: list[str] = []

    def late_read(*a: Any, **k: Any) -> Any:
        seen.append("read")
        return None if len(seen) == 1 else real_read(*a, **k)

    monkeypatch.setattr(preferences, "_read", late_read)
    monkeypatch.setattr(preferences, "_find", lambda *a, **k: None if len(seen) == 1 else real_find(*a, **k))
    before = sim.state.routes.get("cloudquotas.quotaPreferences.create", 0)
    assert preferences.upsert(p, A100, {"region": REGION}, 400, "y", EMAIL, region=REGION) == name
    assert seen == ["read", "read"]
    assert sim.state.routes.get("cloudquotas.quotaPreferences.create", 0) == before + 1  # the 409
    assert _cq(sim).get_quota_preference(name=name).quota_config.preferred_value == 400
    assert len(list(_cq(sim).list_quota_preferences(parent=PARENT))) == 1


def test_missing_contact_email_is_one_line_before_any_call(sim: SimServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KFP_GPU_QUOTA_CONTACT_EMAIL", raising=False)
    p = GkeProvider(PROJECT, REGION, CLUSTER, endpoint=sim.url)
    before = sim.state.requests.copy()
    with pytest.raises(InvalidSpec) as info:
        p.request_quota_increase("NVIDIA_A100_80GB_GPUS", REGION, 256, "x")
    assert info.value.field == "contact_email" and "--contact-email" in str(info.value)
    assert "\n" not in str(info.value) and sim.state.requests == before
    with pytest.raises(InvalidSpec, match="not an email"):
        GkeProvider(PROJECT, REGION, CLUSTER, endpoint=sim.url, contact_email="nobody").request_quota_increase(
            "NVIDIA_A100_80GB_GPUS", REGION, 256, "x")
    monkeypatch.setenv("KFP_GPU_QUOTA_CONTACT_EMAIL", EMAIL)
    assert GkeProvider(PROJECT, REGION, CLUSTER, endpoint=sim.url).contact_email == EMAIL


def test_stand_in_rules(sim: SimServer) -> None:
    cq = _cq(sim)
    with pytest.raises(gexc.BadRequest) as bad:
        cq.create_quota_preference(parent=PARENT, quota_preference=_pref(512, email=""), quota_preference_id="a")
    assert "contact_email" in bad.value.message and bad.value.response.json()["error"]["status"] == "INVALID_ARGUMENT"
    decrease = cq.create_quota_preference(parent=PARENT, quota_preference=_pref(64, email=""),
                                          quota_preference_id="a")  # a decrease needs no email
    with pytest.raises(gexc.Conflict):  # one preference per quota and dimensions, whatever the id
        cq.create_quota_preference(parent=PARENT, quota_preference=_pref(300), quota_preference_id="b")
    mask = field_mask_pb2.FieldMask(paths=["quota_config.preferred_value"])
    up = cloudquotas_v1.QuotaPreference(name=decrease.name, etag="stale",
                                        quota_config=cloudquotas_v1.QuotaConfig(preferred_value=300))
    with pytest.raises(gexc.Conflict) as stale:
        cq.update_quota_preference(quota_preference=up, update_mask=mask)
    assert "etag" in stale.value.message and stale.value.response.json()["error"]["status"] == "ABORTED"
    up.etag = decrease.etag
    with pytest.raises(gexc.BadRequest, match="contact_email"):  # an increase by patch needs the email too
        cq.update_quota_preference(quota_preference=up, update_mask=mask)
    up.contact_email = EMAIL
    done = cq.update_quota_preference(quota_preference=up, update_mask=mask)
    assert done.quota_config.preferred_value == 300 and done.justification == "training"
    missing = cloudquotas_v1.QuotaPreference(name=f"{PARENT}/quotaPreferences/new", **{
        k: getattr(_pref(10), k) for k in ("service", "quota_id", "quota_config", "contact_email")})
    with pytest.raises(gexc.NotFound):
        cq.update_quota_preference(quota_preference=missing, update_mask=mask)
    missing.quota_id = "NVIDIA-L4-GPUS-per-project-region"
    req = cloudquotas_v1.UpdateQuotaPreferenceRequest(quota_preference=missing, allow_missing=True)
    assert cq.update_quota_preference(request=req).name.endswith("/new")
    def listed(flt: str) -> list[str]:
        req = cloudquotas_v1.ListQuotaPreferencesRequest(parent=PARENT, filter=flt, page_size=1)
        return [x.name for x in cq.list_quota_preferences(request=req)]  # pages of one

    assert listed("reconciling=true") == [decrease.name, f"{PARENT}/quotaPreferences/new"]
    assert listed("reconciling=false") == []
    with pytest.raises(gexc.BadRequest):
        listed("quota_id=x")


def test_cli_quota_request_end_to_end(sim: SimServer) -> None:
    env = {**os.environ, "KFP_GPU_SIM_ENDPOINT": sim.url}
    env.pop("KFP_GPU_QUOTA_CONTACT_EMAIL", None)
    cmd = [sys.executable, "-m", "kfp_gpu.cli", "quota", "request", str(REPO / "pipelines/llm_finetune.py"),
           "--metric", "NVIDIA_A100_80GB_GPUS", "--region", REGION, "--value", "256", "--justification", "runs"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "contact_email" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not sim.state.quota_prefs
    for value in ("256", "384"):
        cmd[cmd.index("--value") + 1] = value
        out = subprocess.run([*cmd, "--contact-email", EMAIL], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("quota request filed: projects/local-project/locations/global/quotaPreferences/")
    (pref,) = sim.state.quota_prefs.values()
    assert pref["quotaConfig"]["preferredValue"] in (384, "384")


def test_cli_quota_plan_file_needs_the_contact_email_first(sim: SimServer, tmp_path: Path) -> None:
    sched = tmp_path / "schedule.yaml"
    sched.write_text("runs:\n  - {name: a, date: 2030-01-10, accelerator: a100-80gb, gpus: 256, regions: [us-central1]}\n")
    env = {**os.environ, "KFP_GPU_SIM_ENDPOINT": sim.url}
    env.pop("KFP_GPU_QUOTA_CONTACT_EMAIL", None)
    cmd = [sys.executable, "-m", "kfp_gpu.cli", "quota", "plan", str(REPO / "pipelines/llm_finetune.py"),
           "--schedule", str(sched), "--file"]
    before = dict(sim.state.requests)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2 and "contact_email" in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert dict(sim.state.requests) == before  # refused before any call
    out = subprocess.run([*cmd, "--contact-email", EMAIL], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 4 and "quotaPreferences/kfpgpu-" in out.stdout, out.stderr
    assert len(sim.state.quota_prefs) >= 1


def test_a_stale_etag_is_re_read_and_patched_again(sim: SimServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from kfp_gpu.providers.gke import preferences

    p = GkeProvider(PROJECT, REGION, CLUSTER, endpoint=sim.url, contact_email=EMAIL)
    name = p.request_quota_increase("NVIDIA_A100_80GB_GPUS", REGION, 256, "x")
    real_patch = preferences._patch
    etags: list[str] = []

    def raced(p_: GkeProvider, existing: Any, *a: Any) -> str:
        etags.append(existing.etag)
        if len(etags) == 1:  # someone else edits it between our read and our patch
            other = cloudquotas_v1.QuotaPreference(name=name, justification="someone else", contact_email=EMAIL)
            _cq(sim).update_quota_preference(quota_preference=other,
                                             update_mask=field_mask_pb2.FieldMask(paths=["justification"]))
        return real_patch(p_, existing, *a)

    monkeypatch.setattr(preferences, "_patch", raced)
    assert p.request_quota_increase("NVIDIA_A100_80GB_GPUS", REGION, 300, "y") == name
    assert len(etags) == 2 and etags[0] != etags[1]  # the ABORTED patch was retried from a fresh read
    got = _cq(sim).get_quota_preference(name=name)
    assert got.quota_config.preferred_value == 300 and got.justification == "y"
