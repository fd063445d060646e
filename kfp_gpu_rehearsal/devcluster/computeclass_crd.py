"""GKE's ComputeClass CRD (``computeclasses.cloud.google.com``, ``cloud.google.com/v1``, cluster-scoped) for the dev
cluster, so the GKE stand-in can serve custom ComputeClasses (:mod:`kfp_gpu_rehearsal.sim.computeclass`).

GKE installs this CRD in every cluster of 1.30.3-gke.1451000 or later and publishes no YAML of it: this schema is
written from the CRD reference (https://cloud.google.com/kubernetes-engine/docs/reference/crds/computeclass). It
declares the fields kfp-gpu writes and the stand-in reads, keeps the others (``x-kubernetes-preserve-unknown-fields``),
and refuses what GKE refuses in one priority rule: ``spot: true`` beside ``reservations`` (Spot VMs never consume
reservations) or beside ``flexStart``. Installed additively at test time (:func:`install`): applying it again is a
no-op, and nothing else in the shared cluster changes.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client

from .crds import apply

NAME = "computeclasses.cloud.google.com"

_RULE: dict[str, Any] = {
    "type": "object",
    "x-kubernetes-preserve-unknown-fields": True,
    "properties": {
        "machineFamily": {"type": "string"},
        "gpu": {"type": "object", "properties": {"type": {"type": "string"}, "count": {"type": "integer", "minimum": 1}},
                "x-kubernetes-preserve-unknown-fields": True},
        "spot": {"type": "boolean"},
        "flexStart": {"type": "object", "properties": {"enabled": {"type": "boolean"}},
                      "x-kubernetes-preserve-unknown-fields": True},
        "maxRunDurationSeconds": {"type": "integer", "minimum": 1},
        "reservations": {"type": "object", "properties": {
            "affinity": {"type": "string", "enum": ["Specific", "AnyBestEffort", "None"]},
            "specific": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"}, "project": {"type": "string"}},
                "x-kubernetes-preserve-unknown-fields": True}}},
            "x-kubernetes-preserve-unknown-fields": True},
    },
    "x-kubernetes-validations": [
        {"rule": "!(has(self.spot) && self.spot && has(self.reservations))",
         "message": "a priority rule cannot combine spot: true with reservations (Spot VMs never consume reservations)"},
        {"rule": "!(has(self.spot) && self.spot && has(self.flexStart) && self.flexStart.enabled)",
         "message": "a priority rule cannot combine spot: true with flexStart"},
    ],
}

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": NAME, "labels": {"kfp-gpu.io/stand-in": "gke"}},
    "spec": {
        "group": "cloud.google.com", "scope": "Cluster",
        "names": {"plural": "computeclasses", "singular": "computeclass", "kind": "ComputeClass",
                  "shortNames": ["ccc"]},
        "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                      "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                          "spec": {"type": "object", "required": ["priorities"],
                                   "x-kubernetes-preserve-unknown-fields": True, "properties": {
                                       "priorities": {"type": "array", "minItems": 1, "items": _RULE},
                                       "activeMigration": {"type": "object", "properties": {
                                           "optimizeRulePriority": {"type": "boolean"}},
                                           "x-kubernetes-preserve-unknown-fields": True},
                                       "nodePoolAutoCreation": {"type": "object", "properties": {
                                           "enabled": {"type": "boolean"}}},
                                       "whenUnsatisfiable": {"type": "string",
                                                             "enum": ["ScaleUpAnyway", "DoNotScaleUp"]},
                                   }},
                          "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                      }}}}],
    },
}


def install(api: client.ApiClient, timeout_s: float = 30.0) -> None:
    """Server-side apply the CRD and wait until it is Established. Raises: ApiException, TimeoutError."""
    apply(api, CRD)
    ext = client.ApiextensionsV1Api(api)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition(NAME)
        if any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])):
            return
        time.sleep(0.2)
    raise TimeoutError(f"CRD {NAME} not Established after {timeout_s:g}s")


if __name__ == "__main__":  # python -m kfp_gpu_rehearsal.devcluster.computeclass_crd: install it in the running dev cluster
    from .client import connect

    install(connect().api)
    print(f"{NAME} installed")
