"""Quota and stock are checked where GCE checks them: per VM creation in the managed instance group
(docs/sim.md rules 4 and 4b), on virtual time, through the real REST clients."""

from __future__ import annotations

from google.cloud import compute_v1, container_v1

from tests.sim._helpers import PROJECT, REGION, client_kwargs
from tests.sim.test_sim_world import OPS, gke_op, igm, node, pools, real, set_size, world

RESIZE = real(OPS["pending_s"] + OPS["set_size_s"]) + 0.001  # the operation is DONE, every VM attempted once


def _regions(**quotas: object) -> dict[str, object]:
    return {"us-central1": {"zones": ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"],
                            "quotas": {"NVIDIA_L4_GPUS": 256, "PREEMPTIBLE_NVIDIA_L4_GPUS": 256, **quotas}}}


def _codes(sim: object, pool: str, zone: str) -> list[str]:
    return [e["error"]["code"] for e in sim.state.igm_errors(zone, igm(pool, zone))]  # type: ignore[attr-defined]


def _usage(sim: object, metric: str) -> float:
    r = compute_v1.RegionsClient(**client_kwargs(sim.url)).get(project=PROJECT, region=REGION)  # type: ignore[attr-defined]
    return {q.metric: q.usage for q in r.quotas}[metric]


def test_partial_stockout_creates_k_of_n_and_the_group_retries_the_rest() -> None:
    so = [{"zone": "us-central1-c", "accelerator": "l4", "window": "always", "capacity": 2}]
    with world(stockouts=so, mig_retry_s=60) as (sim, tl, _backend):
        cm = container_v1.ClusterManagerClient(**client_kwargs(sim.url))
        op = set_size(cm, "l4-c", 4)  # room for 2: the operation is not failed at once
        tl.advance(RESIZE)
        done = gke_op(cm, op.name)
        assert done.status == container_v1.Operation.Status.DONE and not done.error.message
        assert _codes(sim, "l4-c", "us-central1-c") == ["ZONE_RESOURCE_POOL_EXHAUSTED"] * 2
        errs = sim.state.igm_errors("us-central1-c", igm("l4-c", ""))
        assert [e["instanceActionDetails"]["instance"].rsplit("/", 1)[1] for e in errs] == [
            node("l4-c", 2), node("l4-c", 3)]
        tl.advance(real(3600))
        assert sorted(sim.nodes("l4-c")) == [node("l4-c", 0), node("l4-c", 1)]  # still 2: no room for more
        assert len(_codes(sim, "l4-c", "us-central1-c")) > 2  # retried every mig_retry_s
        # a full zone fails the next setSize's operation at once, as a whole-zone stockout does
        assert gke_op(cm, set_size(cm, "l4-c", 5).name).error.code == 8


def test_a_gpu_quota_refuses_vm_creations_not_the_resize_and_the_group_retries() -> None:
    with world(regions=_regions(NVIDIA_L4_GPUS=3), mig_retry_s=60) as (sim, tl, _backend):
        cm = container_v1.ClusterManagerClient(**client_kwargs(sim.url))
        set_size(cm, "l4-b", 2)
        tl.advance(RESIZE)
        op = set_size(cm, "l4-a", 3)  # accepted: GCE checks quota when the group creates each VM
        tl.advance(RESIZE)
        assert not gke_op(cm, op.name).error.message
        assert _codes(sim, "l4-a", "us-central1-a") == ["QUOTA_EXCEEDED"] * 2
        msg = sim.state.igm_errors("us-central1-a", igm("l4-a", ""))[0]["error"]["message"]
        assert msg == "Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 3.0 in region us-central1."
        assert _usage(sim, "NVIDIA_L4_GPUS") == 3.0  # refused VMs never existed
        tl.advance(real(600))
        assert len(sim.nodes("l4-a")) == 1
        set_size(cm, "l4-b", 0)  # quota freed: the group's next retries create the missing VMs
        tl.advance(RESIZE + real(600))
        assert len(sim.nodes("l4-a")) == 3 and _usage(sim, "NVIDIA_L4_GPUS") == 3.0


def test_the_cpus_quota_counts_the_machine_types_vcpus() -> None:
    # l4 x1 is g2-standard-4 (4 vCPUs): CPUS 8 holds two VMs
    with world(regions=_regions(CPUS=8), mig_retry_s=60) as (sim, tl, _backend):
        cm = container_v1.ClusterManagerClient(**client_kwargs(sim.url))
        set_size(cm, "l4-a", 3)
        tl.advance(RESIZE)
        assert _codes(sim, "l4-a", "us-central1-a") == ["QUOTA_EXCEEDED"]
        assert "Quota 'CPUS' exceeded.  Limit: 8.0" in sim.state.igm_errors("us-central1-a", igm("l4-a", ""))[0][
            "error"]["message"]
        assert _usage(sim, "CPUS") == 8.0
        set_size(cm, "l4-a", 1)  # shrinking drops the VM not created yet, then a created one
        tl.advance(RESIZE)
        assert _usage(sim, "CPUS") == 4.0


def test_spot_vms_use_preemptible_cpus_when_the_project_has_that_quota_else_cpus() -> None:
    spot_pools = pools(**{"l4-a": {"spot": True}, "l4-b": {"spot": True}})
    with world(pools=spot_pools, regions=_regions(CPUS=4, PREEMPTIBLE_CPUS=8)) as (sim, tl, _backend):
        cm = container_v1.ClusterManagerClient(**client_kwargs(sim.url))
        set_size(cm, "l4-a", 2)
        tl.advance(RESIZE)
        assert _codes(sim, "l4-a", "us-central1-a") == [] and _usage(sim, "PREEMPTIBLE_CPUS") == 8.0
        assert _usage(sim, "CPUS") == 0.0
        set_size(cm, "l4-b", 1)
        tl.advance(RESIZE)
        assert _codes(sim, "l4-b", "us-central1-b") == ["QUOTA_EXCEEDED"]
    with world(pools=spot_pools, regions=_regions(CPUS=4, PREEMPTIBLE_CPUS=0)) as (sim, tl, _backend):
        cm = container_v1.ClusterManagerClient(**client_kwargs(sim.url))
        set_size(cm, "l4-a", 2)
        tl.advance(RESIZE)
        assert _codes(sim, "l4-a", "us-central1-a") == ["QUOTA_EXCEEDED"] and _usage(sim, "CPUS") == 4.0


def test_list_managed_instances_shows_each_vms_action_and_last_creation_error() -> None:
    so = [{"zone": "us-central1-c", "accelerator": "l4", "window": "always", "capacity": 1}]
    with world(stockouts=so, regions=_regions(NVIDIA_L4_GPUS=2)) as (sim, tl, _backend):
        kw = client_kwargs(sim.url)
        cm = container_v1.ClusterManagerClient(**kw)
        set_size(cm, "l4-a", 1)
        set_size(cm, "l4-c", 3)  # room for 1 in the zone; quota for 2 in the region (l4-a holds one)
        tl.advance(RESIZE)
        mig = compute_v1.InstanceGroupManagersClient(**kw)
        got = {m.instance.rsplit("/", 1)[1]: m for m in mig.list_managed_instances(
            project=PROJECT, zone="us-central1-c", instance_group_manager=igm("l4-c", ""))}
        assert got[node("l4-c", 0)].current_action == "CREATING" and got[node("l4-c", 0)].instance_status == "STAGING"
        assert not got[node("l4-c", 0)].last_attempt.errors.errors
        # the region's quota is checked before the zone's stock: the other two VMs are refused for quota
        assert [got[node("l4-c", i)].last_attempt.errors.errors[0].code for i in (1, 2)] == ["QUOTA_EXCEEDED"] * 2
        assert not got[node("l4-c", 1)].instance_status
        tl.advance(real(600))
        done = mig.list_managed_instances(project=PROJECT, zone="us-central1-c", instance_group_manager=igm("l4-c", ""))
        assert [(m.current_action, m.instance_status) for m in done][0] == ("NONE", "RUNNING")
