"""The Trainer profile of the dev cluster (issue 16): the real JobSet (v0.12) and Kubeflow Trainer v2 (v2.3)
controllers with their webhooks served out of cluster, and the ``torch-distributed`` ClusterTrainingRuntime.

A TrainJob goes through the real admission (the Trainer's defaulting and validating webhooks, then JobSet's on the
JobSet and on its pods), becomes a JobSet, Jobs and pods that KWOK runs on the test's GPU nodes, and completes. Kueue
runs beside it (``manageJobsWithoutQueueName: false``; its JobSet/TrainJob integrations are on when it started after
the Trainer CRDs): it must neither suspend nor reject the unlabelled JobSet's Jobs.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from kfp_gpu_rehearsal.devcluster import kueue_profile, runner, trainer_profile
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.devcluster.nodes import GPU_RESOURCE, GPU_TAINT, POOL_LABEL, SIM_DURATION_ANNOTATION
from kfp_gpu_rehearsal.devcluster.trainer_profile import GROUP, RUNTIME, VERSION, Profile
from tests.integration.conftest import NodeFactory
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
RUN_LABEL = "kfp-gpu.io/run-id"


def _trainjob(name: str, *, num_nodes: int = 2, gpus: int = 8, env: list[dict[str, str]] | None = None,
              runtime: str = RUNTIME, pod_spec: dict[str, Any] | None = None,
              pod_meta: dict[str, Any] | None = None) -> dict[str, Any]:
    trainer: dict[str, Any] = {"numNodes": num_nodes, "resourcesPerNode": {
        "requests": {GPU_RESOURCE: str(gpus)}, "limits": {GPU_RESOURCE: str(gpus)}}}
    if env:
        trainer["env"] = env
    spec: dict[str, Any] = {"runtimeRef": {"name": runtime}, "trainer": trainer}
    if pod_spec or pod_meta:
        spec["runtimePatches"] = [{"manager": "kfp-gpu.io/tests", "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
                "metadata": pod_meta or {}, "spec": pod_spec or {}}}}}]}}}}]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob", "metadata": {"name": name}, "spec": spec}


def _create(kube: Kube, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    return dict(kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", body))


def _get(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return dict(kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name))


def _conds(obj: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}


def test_runtime_and_webhooks_are_installed(trainer: Profile, kube: Kube) -> None:
    rt = kube.custom.get_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", RUNTIME)
    assert "torch" in rt["spec"]["mlPolicy"]
    assert [j["name"] for j in rt["spec"]["template"]["spec"]["replicatedJobs"]] == ["node"]
    from kubernetes import client

    adm = client.AdmissionregistrationV1Api(kube.api)
    ports = runner.env_ports(trainer_profile.PORTS)
    for name, port in (("validator.trainer.kubeflow.org", ports["trainer-webhook"]),
                       ("jobset-validating-webhook-configuration", ports["jobset-webhook"])):
        hooks = adm.read_validating_webhook_configuration(name).webhooks
        assert hooks and all(h.client_config.url.startswith(f"https://127.0.0.1:{port}/") for h in hooks)
    pod_hook = next(h for h in adm.read_mutating_webhook_configuration("jobset-mutating-webhook-configuration")
                    .webhooks if h.name == "mpod.kb.io")
    assert pod_hook.object_selector.match_expressions[0].key == "jobset.sigs.k8s.io/jobset-name"


def test_trainjob_becomes_a_jobset_whose_pods_run_and_complete(
        trainer: Profile, kueue: kueue_profile.Profile, kube: Kube, namespace: str, kwok_nodes: NodeFactory) -> None:
    pool, nodes = kwok_nodes(2, gpus=8)
    run_id = uuid.uuid4().hex[:8]
    name = f"tj-{run_id}"
    body = _trainjob(name, pod_meta={"labels": {RUN_LABEL: run_id},
                                     "annotations": {SIM_DURATION_ANNOTATION: "4s"}},
                     pod_spec={"nodeSelector": {POOL_LABEL: pool}, "tolerations": [{**GPU_TAINT, "operator": "Equal"}]})
    t0 = time.monotonic()
    created = _create(kube, namespace, body)
    # the Trainer's defaulting webhook stamped the patch's time; the CRD defaults filled the rest
    assert created["spec"]["runtimePatches"][0].get("time"), created["spec"]["runtimePatches"]
    assert created["spec"]["managedBy"] == "trainer.kubeflow.org/trainjob-controller"

    js = wait_until("JobSet of the TrainJob", lambda: _jobset(kube, namespace, name), timeout=30)
    owner = js["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("TrainJob", name, True)
    assert js["spec"]["suspend"] is False

    def running() -> list[Any]:
        pods = kube.core.list_namespaced_pod(namespace, label_selector=f"{RUN_LABEL}={run_id}").items
        return pods if len(pods) == 2 and all(p.status.phase == "Running" for p in pods) else []

    pods = wait_until("2 TrainJob pods Running", running, timeout=60)
    t_running = time.monotonic() - t0
    assert sorted(p.spec.node_name for p in pods) == sorted(nodes)
    for p in pods:
        assert p.metadata.labels["jobset.sigs.k8s.io/jobset-name"] == name
        assert p.metadata.labels["jobset.sigs.k8s.io/replicatedjob-name"] == "node"
        (c,) = [c for c in p.spec.containers if c.name == "node"]
        assert c.resources.limits[GPU_RESOURCE] == "8"
        env = {e.name: e.value for e in c.env or []}
        assert env["PET_NNODES"] == "2" and env["PET_MASTER_ADDR"] == f"{name}-node-0-0.{name}"
    assert [j["spec"].get("suspend") for j in _jobs(kube, namespace)] == [False]  # Kueue left the Job alone

    done = wait_until("TrainJob Complete", lambda: _conds(_get(kube, namespace, name)).get("Complete") == "True",
                      timeout=60)
    assert done
    print(f"\n[trainer] TrainJob -> 2 pods Running {t_running:.1f}s; -> Complete {time.monotonic() - t0:.1f}s")
    assert _conds(_get(kube, namespace, name)).get("Failed") != "True"


def test_suspend_repatch_resume_moves_the_pods_and_delete_leaves_nothing(
        trainer: Profile, kube: Kube, namespace: str, kwok_nodes: NodeFactory) -> None:
    """The re-placement a recovery needs: suspend (pods go), change the placement patch, resume (pods come back on
    the new nodes); deleting the TrainJob removes everything the controllers made."""
    pool_a, _ = kwok_nodes(2, gpus=8)
    pool_b, nodes_b = kwok_nodes(2, gpus=8)
    run_id = uuid.uuid4().hex[:8]
    name = f"tj-{run_id}"
    tol = [{**GPU_TAINT, "operator": "Equal"}]
    _create(kube, namespace, _trainjob(name, pod_meta={"labels": {RUN_LABEL: run_id},
                                                       "annotations": {SIM_DURATION_ANNOTATION: "600s"}},
                                       pod_spec={"nodeSelector": {POOL_LABEL: pool_a}, "tolerations": tol}))

    def pods() -> list[Any]:
        return list(kube.core.list_namespaced_pod(namespace, label_selector=f"{RUN_LABEL}={run_id}").items)

    def running_on(pool: str) -> bool:
        ps = pods()
        return len(ps) == 2 and all(p.status.phase == "Running" and p.spec.node_name.startswith(pool) for p in ps)

    wait_until(f"2 pods Running on {pool_a}", lambda: running_on(pool_a), timeout=60)
    kube.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name,
                                               {"spec": {"suspend": True}})
    wait_until("pods gone after suspend", lambda: not pods(), timeout=60)
    assert _conds(_get(kube, namespace, name)).get("Suspended") == "True"
    tj = _get(kube, namespace, name)
    tmpl = tj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    tmpl["template"]["spec"]["template"]["spec"]["nodeSelector"] = {POOL_LABEL: pool_b}
    tj["spec"]["suspend"] = False  # one update: the webhook allows patch changes when suspended before or after
    kube.custom.replace_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name, tj)
    wait_until(f"2 pods Running on {pool_b}", lambda: running_on(pool_b), timeout=60)
    assert sorted(p.spec.node_name for p in pods()) == sorted(nodes_b)
    assert _conds(_get(kube, namespace, name)).get("Suspended") == "False"

    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name,
                                                propagation_policy="Foreground")

    def leftovers() -> list[str]:
        out = [f"pod/{p.metadata.name}" for p in pods()]
        out += [f"jobset/{name}"] if _jobset(kube, namespace, name) else []
        out += [f"configmap/{c.metadata.name}" for c in kube.core.list_namespaced_config_map(namespace).items
                if c.metadata.name.startswith(name)]
        out += [f"service/{v.metadata.name}" for v in kube.core.list_namespaced_service(namespace).items]
        return out + [f"job/{j['metadata']['name']}" for j in _jobs(kube, namespace)]

    wait_until("nothing left of the TrainJob", lambda: not leftovers() and _absent(kube, namespace, name), timeout=60)


def _jobs(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    return list(kube.api.call_api(f"/apis/batch/v1/namespaces/{namespace}/jobs", "GET", response_type="object",
                                  auth_settings=["BearerToken"], _return_http_data_only=True)["items"])


def _jobset(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(kube.custom.get_namespaced_custom_object(*JOBSET[:2], namespace, JOBSET[2], name))
    except ApiException as e:
        if e.status == 404:
            return None
        raise


TRAINER_VALIDATOR = "validator.trainjob.trainer.kubeflow.org"
KUEUE_VALIDATOR = "vtrainjob.kb.io"


def _trainjob_validators(kube: Kube) -> set[str]:
    """The validating webhooks the apiserver calls on a TrainJob create, read from the cluster."""
    from kubernetes import client

    adm = client.AdmissionregistrationV1Api(kube.api)
    return {h.name for cfg in adm.list_validating_webhook_configuration().items for h in cfg.webhooks or []
            if any("trainjobs" in (r.resources or []) and "CREATE" in (r.operations or []) for r in h.rules or [])}


# The apiserver calls every matching validating webhook in parallel and reports the refusal that arrived FIRST
# (k8s.io/apiserver admission/plugin/webhook/validating/dispatcher.go: errors are read off a channel in completion
# order). With Kueue's TrainJob integration on (Kueue started after the Trainer CRDs, as `make test` starts them), its
# webhook vtrainjob.kb.io also refuses an unknown runtime (its TopologyAwareScheduling check builds the pod sets), so
# either refusal may be the one reported. Kueue accepts the other two cases.
@pytest.mark.parametrize(("case", "body", "message", "kueue_message"), [
    ("reserved-env", _trainjob("bad-env", env=[{"name": "PET_NNODES", "value": "3"}]), "must not have reserved envs",
     None),
    ("no-runtime", _trainjob("bad-runtime", runtime="no-such-runtime"),
     "specified clusterTrainingRuntime must be created before the TrainJob is created",
     "runtime 'no-such-runtime' not found"),
    # a patch may not set the trainer container's env (that is spec.trainer.env). NB: a patch naming an unknown
    # replicatedJob or container is NOT refused in v2.3.0: the strategic merge adds it before validation, and the
    # controller then fails to create the JobSet (event TrainJobResourcesCreationFailed, no condition).
    ("env-in-node-patch", _trainjob("bad-patch", pod_spec={"containers": [
        {"name": "node", "env": [{"name": "X", "value": "1"}]}]}), "must not have envs for the", None),
])
def test_malformed_trainjob_is_refused_by_the_trainer_webhook(
        trainer: Profile, kube: Kube, namespace: str, case: str, body: dict[str, Any], message: str,
        kueue_message: str | None) -> None:
    validators = _trainjob_validators(kube)
    assert TRAINER_VALIDATOR in validators, validators
    expected = {TRAINER_VALIDATOR: message}
    if kueue_message and KUEUE_VALIDATOR in validators:
        expected[KUEUE_VALIDATOR] = kueue_message
    with pytest.raises(ApiException) as err:
        _create(kube, namespace, body)
    status = json.loads(err.value.body)
    assert (err.value.status, status["reason"]) == (403, "Forbidden"), (case, err.value.body)
    refused_by = next((n for n in expected if status["message"].startswith(f'admission webhook "{n}" denied')), None)
    assert refused_by is not None, (case, status["message"])
    assert expected[refused_by] in status["message"], (case, status["message"])
    assert _absent(kube, namespace, body["metadata"]["name"])


def _absent(kube: Kube, namespace: str, name: str) -> bool:
    try:
        _get(kube, namespace, name)
    except ApiException as e:
        return e.status == 404
    return False
