"""The cloud IAM of the kfp-gpu controller: the shipped roles under ``deploy/`` and the call -> permission tables.

* ``deploy/gcp-role.yaml`` (the controller's GCP custom role, ``gcloud iam roles create --file``) and
  ``deploy/gcp-quota-requester-role.yaml`` (filing quota increases, never the controller's);
  ``deploy/aws-policy.json`` / ``deploy/aws-quota-requester-policy.json``, the same for AWS.
* :data:`GCP_CALLS`: every Google REST method the GKE provider calls (and the few more the stand-in serves),
  with the IAM permission Google checks for it. The provider's error classification names the permission of a
  refused call from it, and the stand-in (:mod:`kfp_gpu_rehearsal.sim`) checks every call against it, so they cannot drift.
* AWS IAM actions are the API operation names under the service's IAM prefix (:data:`AWS_PREFIX`), which the EKS
  provider and the AWS stand-in both derive the same way; :data:`AWS_IMPLIED` lists the extra actions AWS
  checks (tag-on-create).
* The stand-ins' credentials: :data:`SIM_GCP_TOKEN_ENV` holds the OAuth access token the GKE provider sends to a
  plain ``http://`` endpoint (the stand-in); the AWS stand-in reads the SigV4 access key id of the standard
  chain (``AWS_ACCESS_KEY_ID``). :func:`sim_controller_env` is what the rehearsal gives the controller process.

``python -m kfp_gpu.iam --write-doc`` rewrites the cloud-role part of docs/rbac-iam.md from the files. No I/O at
import; the role files are read on demand (a source checkout; an installed wheel ships no ``deploy/``).
"""

from __future__ import annotations

import json
import re
import sys
import urllib.parse
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parents[1]
GCP_ROLE = "deploy/gcp-role.yaml"
GCP_QUOTA_ROLE = "deploy/gcp-quota-requester-role.yaml"
AWS_POLICY = "deploy/aws-policy.json"
AWS_QUOTA_POLICY = "deploy/aws-quota-requester-policy.json"

# The stand-ins' controller identity (the rehearsal's; never a real secret: the stand-ins speak plain http).
SIM_GCP_TOKEN_ENV = "KFP_GPU_SIM_GCP_TOKEN"
SIM_GCP_TOKEN = "ya29.kfp-gpu-sim-controller"  # noqa: S105 - a stand-in principal's name, not a secret
SIM_AWS_KEY_ID = "AKIAKFPGPUSIMCONTROL"
SIM_AWS_SECRET = "kfp-gpu-sim-controller-secret"  # noqa: S105 - as above
SIM_ACCOUNT = "123456789012"


class Call(NamedTuple):
    """One Google REST method: HTTP method, path pattern (matched against the unquoted URL path), the permission
    Google checks, and what kfp-gpu calls it for ("" = the stand-in serves it; kfp-gpu does not call it)."""

    method: str
    path: str
    permission: str
    why: str


_C = r"/compute/v1/projects/[^/]+"
_Z = _C + r"/zones/[^/]+"
_G = r"/v1/projects/[^/]+/locations/[^/]+"
_NP = _G + r"/clusters/[^/]+/nodePools"

GCP_CALLS: tuple[Call, ...] = (
    Call("GET", _C, "compute.projects.get", "the global GPU quota (`GPUS_ALL_REGIONS`)"),
    Call("GET", _C + r"/regions/[^/]+", "compute.regions.get", "regional GPU quotas"),
    Call("GET", _Z + r"/instanceGroupManagers/[^/]+", "compute.instanceGroupManagers.get",
         "per-zone size of a pool's managed instance group"),
    Call("GET", _Z + r"/instanceGroupManagers/[^/]+/listErrors", "compute.instanceGroupManagers.get",
         "the group's launch errors (stockout, quota) for zone failover"),
    Call("POST", _Z + r"/instanceGroupManagers/[^/]+/listManagedInstances", "compute.instanceGroupManagers.get",
         "each VM's current action and last creation error (the stand-in serves it; GCE checks the group's get)"),
    Call("GET", _C + r"/aggregated/instanceGroupManagers", "compute.instanceGroupManagers.list",
         "every group's size in one aggregatedList (pool sizes, GPU-family quota usage)"),
    Call("POST", _Z + r"/instanceGroupManagers/[^/]+/deleteInstances", "compute.instanceGroupManagers.update",
         "remove a run's own VMs (`deleteInstances`): teardown's pool restore, recovery's slot release, rollback"),
    Call("GET", _Z + r"/operations/[^/]+", "compute.zoneOperations.get", "follow reservation and deleteInstances "
         "operations"),
    Call("POST", _Z + r"/operations/[^/]+/wait", "compute.zoneOperations.get", ""),
    Call("GET", _C + r"/regions/[^/]+/operations/[^/]+", "compute.regionOperations.get", ""),
    Call("POST", _C + r"/regions/[^/]+/operations/[^/]+/wait", "compute.regionOperations.get", ""),
    Call("POST", _Z + r"/reservations", "compute.reservations.create", "specific reservations for the warm pool"),
    Call("GET", _Z + r"/reservations/[^/]+", "compute.reservations.get", "re-attach to a run's reservation"),
    Call("DELETE", _Z + r"/reservations/[^/]+", "compute.reservations.delete", "release the reservations at "
         "teardown"),
    Call("GET", _Z + r"/reservations", "compute.reservations.list", ""),
    Call("GET", _C + r"/aggregated/reservations", "compute.reservations.list", "a run's reservations in every zone"),
    # GKE checks node-pool calls against the cluster: there is no container.nodePools.* permission (docs/sim.md)
    Call("GET", _NP, "container.clusters.get", "the cluster's GPU pools (nodePools.list)"),
    Call("GET", _NP + r"/[^/:]+", "container.clusters.get", "one pool: machine type, accelerators, zones, max size "
         "(nodePools.get)"),
    Call("POST", _NP + r"/[^/:]+:setSize", "container.clusters.update", "set the pool size (nodePools.setSize: "
         "scale_up, teardown restore)"),
    Call("GET", _G + r"/operations/[^/]+", "container.operations.get", "follow resize operations"),
    Call("GET", _G + r"/services/[^/]+/quotaInfos/[^/]+", "cloudquotas.quotas.get",
         "Cloud Quotas quota info (GPU-family quotas Compute does not list)"),
    Call("GET", _G + r"/services/[^/]+/quotaInfos", "cloudquotas.quotas.get", ""),
    Call("GET", _G + r"/quotaPreferences/[^/]+", "cloudquotas.quotas.get", "quota request: the existing preference"),
    Call("GET", _G + r"/quotaPreferences", "cloudquotas.quotas.get", "quota request: a preference made elsewhere"),
    Call("POST", _G + r"/quotaPreferences", "cloudquotas.quotas.update", "quota request: create the preference"),
    Call("PATCH", _G + r"/quotaPreferences/[^/]+", "cloudquotas.quotas.update", "quota request: raise it in place"),
)
_GCP_RX = tuple((c, re.compile(f"^{c.path}$")) for c in GCP_CALLS)

# botocore client name -> IAM action prefix (an action is ``prefix:Operation``)
AWS_PREFIX = {"ec2": "ec2", "eks": "eks", "autoscaling": "autoscaling", "service-quotas": "servicequotas"}
# action -> further actions AWS authorizes with it (tag on create: "you must have permission to use ec2:CreateTags")
AWS_IMPLIED: dict[str, tuple[str, ...]] = {"ec2:CreateCapacityReservation": ("ec2:CreateTags",)}
# actions only `kfp-gpu quota request` makes (deploy/aws-quota-requester-policy.json), never the controller
AWS_QUOTA_REQUEST_ONLY = frozenset({"servicequotas:RequestServiceQuotaIncrease",
                                    "servicequotas:ListRequestedServiceQuotaChangeHistoryByQuota"})


def gcp_call(method: str, url: str) -> Call | None:
    """The :data:`GCP_CALLS` row of a REST call (``url``: a full URL or a path; query ignored), or None."""
    path = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
    return next((c for c, rx in _GCP_RX if c.method == method and rx.match(path)), None)


def gcp_permission(method: str, url: str) -> str:
    """The IAM permission Google checks for a REST call; "" when the table does not know the call."""
    call = gcp_call(method, url)
    return call.permission if call is not None else ""


def gcp_fix(permission: str) -> str:
    """The one-line fix for a refused GCP ``permission``: the shipped role file that must grant it."""
    role, name = (GCP_QUOTA_ROLE, "kfpGpuQuotaRequester") if permission == "cloudquotas.quotas.update" else \
        (GCP_ROLE, "kfpGpuController")
    return (f"add {permission} to includedPermissions in {role} and apply it (gcloud iam roles update {name} "
            f"--project=PROJECT --file={role}), or grant it to the caller's service account")


def aws_fix(action: str) -> str:
    """The one-line fix for a refused AWS ``action``: the shipped policy file that must allow it."""
    policy = AWS_QUOTA_POLICY if action in AWS_QUOTA_REQUEST_ONLY else AWS_POLICY
    return f"add {action} to the Allow statements of {policy} and update the caller's IAM policy from it"


# ---- the shipped role files --------------------------------------------------------------------
def _read(rel: str) -> str:
    path = REPO / rel
    try:
        return path.read_text()
    except OSError as exc:
        raise FileNotFoundError(f"{path}: cannot read the shipped role ({exc.strerror}); run from a source "
                                "checkout of kfp-gpu (an installed wheel ships no deploy/)") from None


def gcp_role(rel: str = GCP_ROLE) -> dict[str, Any]:
    """A GCP custom-role file as ``gcloud iam roles create --file`` takes it. Raises: FileNotFoundError, ValueError."""
    import yaml

    data = yaml.safe_load(_read(rel))
    if not isinstance(data, dict) or not isinstance(data.get("includedPermissions"), list):
        raise ValueError(f"{rel}: includedPermissions must be a list of permissions")
    return data


def gcp_permissions(rel: str = GCP_ROLE) -> frozenset[str]:
    return frozenset(str(p) for p in gcp_role(rel)["includedPermissions"])


def aws_policy(rel: str = AWS_POLICY) -> dict[str, Any]:
    """An IAM policy document. Raises: FileNotFoundError, ValueError (not JSON / no Statement list)."""
    data = json.loads(_read(rel))
    if not isinstance(data, dict) or not isinstance(data.get("Statement"), list):
        raise ValueError(f"{rel}: an IAM policy document needs a Statement list")
    return data


def aws_actions(rel: str = AWS_POLICY) -> frozenset[str]:
    """The actions the policy's Allow statements name (conditions and resources are not evaluated)."""
    out: set[str] = set()
    for st in aws_policy(rel)["Statement"]:
        if st.get("Effect") == "Allow":
            acts = st.get("Action", [])
            out.update([acts] if isinstance(acts, str) else acts)
    return frozenset(out)


def sim_controller_env() -> dict[str, str]:
    """The stand-ins' controller credentials, for the controller process only (never a step's)."""
    return {SIM_GCP_TOKEN_ENV: SIM_GCP_TOKEN, "AWS_ACCESS_KEY_ID": SIM_AWS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SIM_AWS_SECRET}


# ---- docs/rbac-iam.md ----------------------------------------------------------------------------
DOC = "docs/rbac-iam.md"
CLOUDS = ("gcp", "aws")


def markers(cloud: str) -> tuple[str, str]:
    return (f"<!-- iam:{cloud} begin (generated from deploy/ by python -m kfp_gpu.iam --write-doc) -->",
            f"<!-- iam:{cloud} end -->")


def _why(permission: str) -> str:
    return "; ".join(dict.fromkeys(c.why for c in GCP_CALLS if c.permission == permission and c.why))


def _names(items: frozenset[str]) -> str:
    return ", ".join(f"`{x}`" for x in sorted(items))


def doc_section(cloud: str) -> str:
    """The generated text between the ``cloud`` markers of docs/rbac-iam.md. Raises: FileNotFoundError, ValueError."""
    if cloud == "gcp":
        lines = [f"The controller's custom role, [`{GCP_ROLE}`](../{GCP_ROLE}): exactly the permissions of the calls "
                 "the GKE provider makes (`tests/unit/test_iam.py` checks both ways).", "",
                 "| permission | used for |", "|---|---|"]
        lines += [f"| `{p}` | {_why(p)} |" for p in sorted(gcp_permissions())]
        lines += ["", "Filing quota increases (`kfp-gpu quota request`, `kfp-gpu quota plan --file`) is a separate role "
                  f"for a human or a planner job, never the controller: [`{GCP_QUOTA_ROLE}`](../{GCP_QUOTA_ROLE}) "
                  f"({_names(gcp_permissions(GCP_QUOTA_ROLE))}).", "", "```bash", "PROJECT=my-project",
                  f"gcloud iam roles create kfpGpuController --project=$PROJECT --file={GCP_ROLE}",
                  f"gcloud iam roles create kfpGpuQuotaRequester --project=$PROJECT --file={GCP_QUOTA_ROLE}", "```"]
        return "\n".join(lines)
    return "\n".join([
        f"The controller's policy, [`{AWS_POLICY}`](../{AWS_POLICY}), allows exactly the actions the EKS provider "
        f"calls: {_names(aws_actions())} (`ec2:CreateTags` because the reservation is tagged on create). "
        f"`kfp-gpu quota request` needs [`{AWS_QUOTA_POLICY}`](../{AWS_QUOTA_POLICY}) "
        f"({_names(aws_actions(AWS_QUOTA_POLICY))}).", "", "```bash",
        f"aws iam create-policy --policy-name kfp-gpu-controller --policy-document file://{AWS_POLICY}",
        f"aws iam create-policy --policy-name kfp-gpu-quota-requester --policy-document file://{AWS_QUOTA_POLICY}",
        "```"])


def render_doc(text: str) -> str:
    """``text`` (docs/rbac-iam.md) with every generated section rewritten. Raises: ValueError (markers missing)."""
    for cloud in CLOUDS:
        begin, end = markers(cloud)
        if begin not in text or end not in text:
            raise ValueError(f"{DOC}: the markers {begin!r} / {end!r} are missing")
        head, rest = text.split(begin, 1)
        text = f"{head}{begin}\n{doc_section(cloud)}\n{end}{rest.split(end, 1)[1]}"
    return text


def write_doc(path: Path | None = None) -> bool:
    """Rewrite the generated sections of docs/rbac-iam.md; True when it changed. Raises: ValueError (no markers)."""
    path = path or REPO / DOC
    text = path.read_text()
    new = render_doc(text)
    if new != text:
        path.write_text(new)
    return new != text


def main(argv: list[str]) -> int:
    if argv == ["--write-doc"]:
        print(f"{DOC}: {'rewritten' if write_doc() else 'up to date'}")
        return 0
    if argv == ["--doc"]:
        print("\n\n".join(doc_section(c) for c in CLOUDS))
        return 0
    print("usage: python -m kfp_gpu.iam --doc | --write-doc", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
