"""The step ledger: what a step created, stored in the cluster as a labelled ConfigMap.

A retried pod reads its ledger and re-attaches instead of creating twice; teardown and the janitor find
ledgers (and everything else) by the run-id label, never by task outputs.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu.ownership import (
    LABEL_LEASE,
    LABEL_RUN_ID,
    LABEL_STEP,
    LEDGER_LABEL,
    RUN_ID_RAW_ANNOTATION,
    Owner,
    label_safe,
)


def ledger_name(run_id: str, step: str) -> str:
    return f"kfp-gpu-ledger-{label_safe(run_id)[:40]}-{label_safe(step)}".lower().replace("_", "-").replace(".", "-")


def read(api: client.ApiClient, namespace: str, run_id: str, step: str) -> dict[str, Any]:
    """The ledger of (run_id, step), or {} when the step never wrote one. Raises: ApiException (non-404)."""
    core = client.CoreV1Api(api)
    try:
        cm = core.read_namespaced_config_map(ledger_name(run_id, step), namespace)
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
    name = ledger_name(owner.run_id, owner.step)
    labels = {**owner.labels(), LEDGER_LABEL: "true"}
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
    """Every ledger of ``run_id`` (or of every run when None). Raises: ApiException."""
    selector = f"{LEDGER_LABEL}=true"
    if run_id is not None:
        selector += f",{LABEL_RUN_ID}={label_safe(run_id)}"
    return list(client.CoreV1Api(api).list_namespaced_config_map(namespace, label_selector=selector).items)


def step_of(cm: client.V1ConfigMap) -> str:
    return str((cm.metadata.labels or {}).get(LABEL_STEP, ""))


def data_of(cm: client.V1ConfigMap) -> dict[str, Any]:
    return dict(json.loads((cm.data or {}).get("ledger", "{}")))


def data_of_json(cm: dict[str, Any]) -> dict[str, Any]:
    """``data_of`` for a ConfigMap as the API server's JSON (the janitor lists raw objects)."""
    return dict(json.loads((cm.get("data") or {}).get("ledger", "{}")))
