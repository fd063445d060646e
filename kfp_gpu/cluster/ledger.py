"""The step ledger: what a step created, stored in the cluster as a labelled ConfigMap.

A retried pod reads its ledger and re-attaches instead of creating twice; teardown and the janitor find
ledgers (and everything else) by the run-id label, never by task outputs.

**Where a ledger lives.** A ledger steers privileged work: teardown restores node pools to the sizes it records.
A ledger in the tenant's namespace is editable by anything that runs there (in multi-user Kubeflow, every
pipeline pod of the profile), which would let a tenant make the controller resize any pool. So the controller
keeps the ledgers it writes in its own namespace (``KFP_GPU_LEDGER_NAMESPACE``, set by ``kfp-gpu controller`` to
its namespace, where tenants hold no rights), named and labelled by the gang's namespace
(:data:`TENANT_LABEL`). Every function here takes the *gang's* namespace and finds the home itself; without the
variable (a step function run by hand or by a test) the home is the gang's namespace.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu.cluster.kube import ignore_404
from kfp_gpu.ownership import (
    LABEL_LEASE,
    LABEL_RUN_ID,
    LABEL_STEP,
    LEDGER_GANG_NAMESPACE_LABEL,
    LEDGER_LABEL,
    RUN_ID_RAW_ANNOTATION,
    Owner,
    label_safe,
)

TENANT_LABEL = LEDGER_GANG_NAMESPACE_LABEL  # the namespace of the gang whose ledger this is
HOME_ENV = "KFP_GPU_LEDGER_NAMESPACE"


def home(namespace: str) -> str:
    """The namespace that holds the ledgers of a gang in ``namespace``."""
    return os.environ.get(HOME_ENV, "") or namespace


def ledger_name(run_id: str, step: str, namespace: str = "") -> str:
    """The ledger's ConfigMap name; ``namespace`` (the gang's) is part of it when the ledger lives elsewhere."""
    where = f"{namespace}-" if namespace and home(namespace) != namespace else ""
    return f"kfp-gpu-ledger-{where}{label_safe(run_id)[:40]}-{label_safe(step)}".lower().replace(
        "_", "-").replace(".", "-")


def read(api: client.ApiClient, namespace: str, run_id: str, step: str) -> dict[str, Any]:
    """The ledger of (run_id, step) of a gang in ``namespace``, or {} when the step never wrote one.

    Raises: ApiException (non-404)."""
    core = client.CoreV1Api(api)
    try:
        cm = core.read_namespaced_config_map(ledger_name(run_id, step, namespace), home(namespace))
    except ApiException as exc:
        if exc.status == 404:
            return {}
        raise
    return dict(json.loads((cm.data or {}).get("ledger", "{}")))


def write(api: client.ApiClient, namespace: str, owner: Owner, data: dict[str, Any]) -> None:
    """Create or replace the ledger of ``owner``.

    The replace is conditional on the resourceVersion read just before it, and keeps the existing
    ``kfp-gpu.io/lease-expires`` label when it is later than ``owner``'s: a step writing with an older
    :class:`Owner` never shortens a lease the heartbeat extended.

    Raises: ApiException (a conflict only when every attempt met a concurrent write).
    """
    core = client.CoreV1Api(api)
    name, gang_namespace, namespace = ledger_name(owner.run_id, owner.step, namespace), namespace, home(namespace)
    labels = {**owner.labels(), LEDGER_LABEL: "true", TENANT_LABEL: gang_namespace}
    body = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=name, labels=labels, annotations={RUN_ID_RAW_ANNOTATION: owner.run_id}),
        data={"ledger": json.dumps(data, sort_keys=True)},
    )
    try:
        core.create_namespaced_config_map(namespace, body)
        return
    except ApiException as exc:
        if exc.status != 409:
            raise
    for attempt in range(5):
        cur = core.read_namespaced_config_map(name, namespace)
        old = (cur.metadata.labels or {}).get(LABEL_LEASE, "")
        try:
            newer = float(old) > owner.lease_expires
        except ValueError:
            newer = False
        body.metadata.labels = {**labels, LABEL_LEASE: old} if newer else labels
        body.metadata.resource_version = cur.metadata.resource_version
        try:
            core.replace_namespaced_config_map(name, namespace, body)
            return
        except ApiException as exc:
            if exc.status != 409 or attempt == 4:
                raise


def list_for_run(api: client.ApiClient, namespace: str, run_id: str | None) -> list[client.V1ConfigMap]:
    """Every ledger of ``run_id`` (or of every run when None) of gangs in ``namespace``. Raises: ApiException."""
    selector = f"{LEDGER_LABEL}=true"
    if run_id is not None:
        selector += f",{LABEL_RUN_ID}={label_safe(run_id)}"
    where = home(namespace)
    if where != namespace:
        selector += f",{TENANT_LABEL}={namespace}"
    return list(client.CoreV1Api(api).list_namespaced_config_map(where, label_selector=selector).items)


def delete(api: client.ApiClient, cm: client.V1ConfigMap) -> bool:
    """Delete one ledger (as :func:`list_for_run` returned it) where it lives. False when it was already gone.

    Raises: ApiException (non-404)."""
    core = client.CoreV1Api(api)
    return ignore_404(functools.partial(core.delete_namespaced_config_map, cm.metadata.name, cm.metadata.namespace))


def step_of(cm: client.V1ConfigMap) -> str:
    return str((cm.metadata.labels or {}).get(LABEL_STEP, ""))


def data_of(cm: client.V1ConfigMap) -> dict[str, Any]:
    return dict(json.loads((cm.data or {}).get("ledger", "{}")))


def data_of_json(cm: dict[str, Any]) -> dict[str, Any]:
    """``data_of`` for a ConfigMap as the API server's JSON (the janitor lists raw objects)."""
    return dict(json.loads((cm.get("data") or {}).get("ledger", "{}")))
