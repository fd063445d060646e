"""Fixtures for tests against the local control plane (kfp_gpu_rehearsal.devcluster).

``kube``       session fixture: boots the dev cluster (or re-uses a running, healthy one) and
               returns a :class:`kfp_gpu_rehearsal.devcluster.client.Kube` with ``kubeconfig`` (Path) and ``api`` (kubernetes ApiClient).
               If binaries are missing or boot fails the test FAILS (never skips).
``namespace``  a fresh namespace per test, deleted afterwards.
``kwok_nodes`` factory ``kwok_nodes(n, gpus=8, boot_delay_s=0.0, spot=False) -> (pool, [names])``
               creating KWOK GPU nodes in a pool unique to the test; deleted afterwards.
``rbac_identity`` factory ``rbac_identity(sa="kfp-gpu-controller", drop=()) -> Identity``: for
               ``kfp-gpu-controller``, the controller's rights (kfp_gpu/manifests/controller-rbac.yaml: ClusterRole
               kfp-gpu-controller through a ClusterRoleBinding, ClusterRole kfp-gpu-controller-tenant through a
               RoleBinding in the test namespace, as ``kfp-gpu tenant add`` binds it) for a ServiceAccount of that
               name in the test namespace; for ``kfp-gpu-janitor``, deploy/janitor-rbac.yaml rendered for the test
               namespace. ClusterRoles are renamed per test; ``drop`` takes verbs out. Applied, and a client
               holding only a TokenRequest token of ServiceAccount ``sa`` (tests/integration/rbac_support.py).
               Cluster-scoped objects are deleted afterwards. Any 401/403 answered to a client of the full
               rights fails the test at teardown, even when the code swallowed it.
``step_identity`` / ``step_api``       the controller's identity: what the step functions run under (in the
               controller's work units); Identity / its ApiClient. ``kube.api`` (admin) stays for setup,
               assertions and the stand-in.
``janitor_identity`` / ``janitor_api`` the janitor's ServiceAccount (kfp-gpu-janitor), the same way.
``autoscaler`` session fixture: the cluster-autoscaler profile running (``devcluster up --autoscaler
               cluster-autoscaler``, idempotent); a :class:`kfp_gpu_rehearsal.devcluster.ca_profile.Profile` (kubeconfig,
               node_groups, log, pid). FAILS (never skips) when cluster-autoscaler cannot run.
``kueue``      session fixture: the Kueue profile running (``devcluster up --kueue``, idempotent; leaves the
               cluster-autoscaler profile as it is); a :class:`kfp_gpu_rehearsal.devcluster.kueue_profile.Profile`
               (kubeconfig, log, pid, api_version). FAILS (never skips) when Kueue cannot run.
``trainer``    session fixture: the Trainer profile running (``devcluster up --with trainer``, idempotent): the real
               JobSet and Kubeflow Trainer v2 controllers, their webhooks and the torch-distributed
               ClusterTrainingRuntime; a :class:`kfp_gpu_rehearsal.devcluster.trainer_profile.Profile`. FAILS (never skips).
``karpenter``  session fixture: the Karpenter profile running (``devcluster up --autoscaler karpenter``, idempotent;
               leaves the cluster-autoscaler profile as it is): Karpenter's kwok provider with AWS GPU instance types
               and no NodePool; a :class:`kfp_gpu_rehearsal.devcluster.karpenter_profile.Profile` (kubeconfig, log, pid,
               node_class). FAILS (never skips) when the binary is missing or Karpenter cannot run.
``built_images`` session fixture: ``make images`` (kfp_gpu_rehearsal.devcluster.images.ensure: builds what is missing or
               stale by content hash, seconds when warm); returns podman's environment. FAILS (never skips) when
               podman is missing or a build fails.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kfp_gpu_rehearsal.devcluster import ca_profile, karpenter_profile, kueue_profile, trainer_profile
from kfp_gpu_rehearsal.devcluster.client import Kube, ensure_up
from kfp_gpu_rehearsal.devcluster.nodes import make_gpu_node
from tests.integration.controller_support import lease, tenant  # noqa: F401 - fixtures, for every test here
from tests.integration.rbac_support import (
    CONTROLLER_SA,
    JANITOR_SA,
    Drop,
    Identity,
    Obj,
    bind,
    delete_cluster_scoped,
    render,
    render_controller,
)
from tests.tiers import require_integration

NodeFactory = Callable[..., tuple[str, list[str]]]


@pytest.fixture(scope="session")
def kube(request: pytest.FixtureRequest) -> Kube:
    require_integration(request, "the dev cluster (kube)")
    try:
        return ensure_up()
    except Exception as e:  # noqa: BLE001 - any boot failure must fail loudly, never skip
        pytest.fail(f"dev cluster failed to boot (python -m kfp_gpu_rehearsal.devcluster build; ... up): {e}",
                    pytrace=False)


@pytest.fixture(scope="session")
def autoscaler(kube: Kube) -> ca_profile.Profile:
    try:
        return ca_profile.ensure_up()
    except Exception as e:  # noqa: BLE001 - CA that cannot run must fail loudly, never skip
        pytest.fail(f"cluster-autoscaler profile failed (make cluster-up AUTOSCALER=cluster-autoscaler): {e}",
                    pytrace=False)


@pytest.fixture(scope="session")
def kueue(kube: Kube) -> kueue_profile.Profile:
    try:
        return kueue_profile.ensure_up()
    except Exception as e:  # noqa: BLE001 - Kueue that cannot run must fail loudly, never skip
        pytest.fail(f"Kueue profile failed (make cluster-up KUEUE=1): {e}", pytrace=False)


@pytest.fixture(scope="session")
def trainer(kube: Kube) -> trainer_profile.Profile:
    try:
        return trainer_profile.ensure_up()
    except Exception as e:  # noqa: BLE001 - a Trainer that cannot run must fail loudly, never skip
        pytest.fail(f"Trainer profile failed (make cluster-up TRAINER=1): {e}", pytrace=False)


@pytest.fixture(scope="session")
def karpenter(kube: Kube) -> karpenter_profile.Profile:
    try:
        return karpenter_profile.ensure_up()
    except Exception as e:  # noqa: BLE001 - a Karpenter that cannot run must fail loudly, never skip
        pytest.fail(f"Karpenter profile failed (make cluster-up AUTOSCALER=karpenter): {e}", pytrace=False)


@pytest.fixture(scope="session")
def built_images() -> dict[str, str]:
    from kfp_gpu_rehearsal.devcluster import images

    images.ensure()
    return images.podman_env(images.cache_dir())


def _slug(nodeid: str, n: int = 30) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", nodeid.split("::")[-1].lower()).strip("-")[:n].strip("-")


def scoped_namespace(kube: Kube, name: str) -> Iterator[str]:
    """Create namespace ``name`` (labelled as a test's), yield it, delete it."""
    kube.core.create_namespace({"metadata": {"name": name, "labels": {"kfp-gpu.io/test": "true"}}})
    yield name
    try:
        kube.core.delete_namespace(name, propagation_policy="Background")
    except ApiException as e:
        if e.status != 404:
            raise


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from scoped_namespace(kube, f"t-{_slug(request.node.nodeid)}-{uuid.uuid4().hex[:6]}")


@pytest.fixture
def kwok_nodes(kube: Kube, request: pytest.FixtureRequest) -> Iterator[NodeFactory]:
    created: list[str] = []

    def make(n: int, gpus: int = 8, boot_delay_s: float = 0.0, spot: bool = False,
             accelerator: str = "nvidia-h100-80gb", zone: str = "us-central1-a") -> tuple[str, list[str]]:
        pool = f"p-{_slug(request.node.nodeid, 20)}-{uuid.uuid4().hex[:5]}"
        names = [f"{pool}-{i}" for i in range(n)]
        for name in names:
            kube.core.create_node(make_gpu_node(name, pool, accelerator, zone, gpus=gpus, spot=spot,
                                                boot_delay_s=boot_delay_s))
            created.append(name)
        return pool, names

    yield make
    for name in created:
        try:
            kube.core.delete_node(name)
        except ApiException as e:
            if e.status != 404:
                raise


IdentityFactory = Callable[..., Identity]


@pytest.fixture
def rbac_identity(kube: Kube, namespace: str, tmp_path: Path) -> Iterator[IdentityFactory]:
    applied: list[list[Obj]] = []
    complete: list[Identity] = []

    def make(sa: str = CONTROLLER_SA, drop: tuple[Drop, ...] = ()) -> Identity:
        assert sa in (CONTROLLER_SA, JANITOR_SA), sa
        render_for = render_controller if sa == CONTROLLER_SA else render
        objs = render_for(namespace, isolate=namespace, drop=drop)
        applied.append(objs)
        ident = bind(kube.api, namespace, sa, tmp_path, objs)
        if not drop:
            complete.append(ident)
        return ident

    yield make
    for objs in applied:
        delete_cluster_scoped(kube.api, objs)
    denied = [f"{i.name}: {d}" for i in complete for d in i.api.denied]
    if denied:  # also the 403s the code only logged (heartbeat, watch retries, preflight UNKNOWN)
        pytest.fail("the API server refused the ServiceAccount (add the rule to kfp_gpu/manifests/controller-rbac.yaml "
                    "or deploy/janitor-rbac.yaml, and to tests/integration/rbac_needs.py):\n  "
                    + "\n  ".join(dict.fromkeys(denied)), pytrace=False)


@pytest.fixture
def step_identity(rbac_identity: IdentityFactory) -> Identity:
    """The controller's identity: what the step functions run under (its rights, for a test ServiceAccount)."""
    return rbac_identity(CONTROLLER_SA)


@pytest.fixture
def step_api(step_identity: Identity) -> client.ApiClient:
    """The controller's identity as an ApiClient (only its token): pass it to the step functions."""
    return step_identity.api


@pytest.fixture
def janitor_identity(rbac_identity: IdentityFactory) -> Identity:
    return rbac_identity(JANITOR_SA)


@pytest.fixture
def janitor_api(janitor_identity: Identity) -> client.ApiClient:
    return janitor_identity.api
