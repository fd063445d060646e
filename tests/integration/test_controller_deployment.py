"""The controller's Deployment as a container: kfp_gpu/manifests/controller.yaml's pod template (image, command,
env with the downward API, the pod's and the container's securityContext, the emptyDir /tmp, the memory limit)
run by podman from the component image built here (``make images``), with the in-cluster credentials a pod of the
``kfp-gpu-controller`` ServiceAccount gets (token, CA and namespace at /var/run/secrets/kubernetes.io/serviceaccount,
``KUBERNETES_SERVICE_HOST``/``PORT``). KWOK nodes run no containers, so podman plays the kubelet
(kfp_gpu_rehearsal/devcluster/podman_pod.py). The manifest's args change in two places only: ``--namespace`` the
test's tenant instead of ``--all-namespaces``, and the test's own Lease (the dev cluster serves other tenants).

The second replica is a process with the same flags. Both keep the Deployment's election timings (15 s / 10 s /
2 s, never shortened here): the takeover after a ``kill -9`` of the container is measured at those."""

from __future__ import annotations

import socket
import time
import urllib.request
import uuid

import pytest

from kfp_gpu import iam
from kfp_gpu.gang import api as gang
from kfp_gpu_rehearsal.devcluster import boot, images, podman_pod
from kfp_gpu_rehearsal.devcluster import controller as local_controller
from tests.integration.controller_support import ROOT, holder, lease_spec, new_run, small
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]  # a cold run builds the component image first

MANIFEST = ROOT / "kfp_gpu/manifests/controller.yaml"
LEASE_S, RETRY_S, JITTER = 15, 2.0, 1.2  # the Deployment's (kfp_gpu/plan/election.py DEFAULT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_controller_deployment_s_container_leads_serves_a_gang_and_its_standby_takes_over_at_the_default_lease(
        lease, tenant, built_images, kube, tmp_path):
    t = tenant(start=False)
    token = local_controller.mint_token(kube.api, gang.CONTROLLER_NAMESPACE, gang.CONTROLLER_SA, ttl_s=3600)
    sa_dir, server = podman_pod.service_account_dir(tmp_path / "sa", token, boot.kubeconfig_path(),
                                                    gang.CONTROLLER_NAMESPACE)
    pod, port = f"kfp-gpu-controller-{t.ns}-ctr", _free_port()
    name = f"kfp-gpu-test-{uuid.uuid4().hex[:8]}"
    argv = podman_pod.container_argv(
        podman_pod.deployment(MANIFEST), images.COMPONENT, name=name, pod_name=pod, sa_dir=sa_dir, server=server,
        args=["controller", "--namespace", t.ns, "--leader-elect-resource-name", lease, "--metrics-port", str(port)],
        env=iam.sim_controller_env())  # the stand-ins' controller credentials (a Secret on a real cluster)
    assert "--read-only" in argv and "--user" in argv and "--cap-drop=ALL" in argv, argv  # rendered, not skipped
    replicas = (pod, f"kfp-gpu-controller-{t.ns}-b")
    podman_pod.podman(argv, built_images)

    def logs() -> str:
        return podman_pod.podman(["logs", name], built_images, check=False).stderr[-3000:]

    try:
        t0 = time.monotonic()
        wait_until("the container leads", lambda: holder(t, lease, replicas) == pod, timeout=120, every=0.2)
        print(f"container started -> Lease held in {time.monotonic() - t0:.1f}s")
        standby = local_controller.LocalController(t.ctl_kubeconfig, [t.ns], t.workdir / "b" / "controller.log",
                                                   lease=lease, replica=f"kfp-gpu-controller-{t.ns}-b").start()
        t.controllers.append(standby)

        spec, run = t.spec(2, zones=("us-central1-a",)), new_run()
        for step in ("preflight", "warm_pool", "scale_up"):
            out = t.step(step, spec, run)
            assert small(out.output_json), out.output_json
        g = t.gang(run) or {}
        assert gang.is_true(g, gang.PROVISIONED), f"{g.get('status')}\n{logs()}"
        assert len(t.sim_nodes()) == 2 and t.resizes() == 1, t.sim.request_counts()
        assert holder(t, lease, replicas) == pod, "the container did the work"
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()  # noqa: S310
        assert 'kfp_gpu_gangs{phase="Ready"} 1' in metrics and "kfp_gpu_gpus_held 16" in metrics, metrics[:2000]

        podman_pod.podman(["kill", "--signal", "KILL", name], built_images)  # kill -9, the Lease left held
        killed = time.monotonic()
        wait_until("the standby leads", lambda: holder(t, lease, replicas) == f"kfp-gpu-controller-{t.ns}-b",
                   timeout=LEASE_S + 30, every=0.05)
        took = time.monotonic() - killed
        print(f"kill -9 of the container -> the standby holds the Lease {took:.2f}s later (lease {LEASE_S}s, retry "
              f"{RETRY_S}s)")
        # the standby times the holder's last record from when it first saw it: at most one renewal (retry) before
        # the kill, and seen at most one jittered retry after it; then one jittered retry to notice the expiry
        assert LEASE_S - RETRY_S - 0.5 <= took <= LEASE_S + 2 * RETRY_S * (1 + JITTER) + 1.0, took
        assert lease_spec(t, lease)["transitions"] == 1 and lease_spec(t, lease)["duration"] == LEASE_S

        t.step("teardown", spec, run)
        wait_until("the gang's nodes gone", lambda: not t.sim_nodes(), timeout=60)
        assert sum(int(p.target) for p in t.sim.state.pools.values()) == 0
    finally:
        podman_pod.podman(["rm", "--force", name], built_images, check=False)
