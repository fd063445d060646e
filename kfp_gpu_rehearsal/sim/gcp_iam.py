"""IAM of the GKE/Compute/Cloud Quotas stand-in: OAuth access token -> principal -> permissions, checked on every call.

The default principal (token :data:`kfp_gpu.iam.SIM_GCP_TOKEN`) holds exactly ``deploy/gcp-role.yaml``, and
:data:`QUOTA_TOKEN` holds ``deploy/gcp-quota-requester-role.yaml``; tests grant other tokens other permission sets
(``SimServer.grant``). Each REST call's permission comes from :data:`kfp_gpu.iam.GCP_CALLS`, the table the
provider's classification reads. Refusals are Google's (docs/sim.md, "Credentials and IAM"):

* no or an unknown bearer token: 401 ``UNAUTHENTICATED``;
* a permission the principal lacks: 403; Compute ``Required 'P' permission for 'R'`` (reason ``forbidden``),
  GKE ``Required "P" permission(s) for "R".`` (``PERMISSION_DENIED``), Cloud Quotas ``Permission 'P' denied on
  resource '//cloudquotas.googleapis.com/R' (or it may not exist).`` (ErrorInfo ``IAM_PERMISSION_DENIED``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from kfp_gpu import iam
from kfp_gpu_rehearsal.sim.api import COMPUTE, QUOTAS, service_of
from kfp_gpu_rehearsal.sim.shapes import SimHttpError, http_error

QUOTA_TOKEN = "ya29.kfp-gpu-sim-quota-requester"  # noqa: S105 - a stand-in principal's name, not a secret
_VERBS = ("deleteInstances", "listErrors", "wait")


class Principals:
    """Bearer token -> the permissions of its principal's role. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roles: dict[str, frozenset[str]] = {
            iam.SIM_GCP_TOKEN: iam.gcp_permissions(iam.GCP_ROLE),
            QUOTA_TOKEN: iam.gcp_permissions(iam.GCP_QUOTA_ROLE),
        }

    def grant(self, token: str, permissions: Iterable[str]) -> None:
        """Give ``token`` exactly ``permissions`` (replacing what it had)."""
        with self._lock:
            self._roles[token] = frozenset(permissions)

    def check(self, method: str, path: str, authorization: str) -> None:
        """Raises: SimHttpError (401 / 403 as Google answers) unless the caller may make this call."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        with self._lock:
            perms = self._roles.get(token) if token else None
        if perms is None:
            raise unauthenticated(bool(token))
        permission = iam.gcp_permission(method, path)  # "" = no such API method: the router answers 404
        if permission and permission not in perms:
            raise denied(path, permission)


def unauthenticated(had_token: bool) -> SimHttpError:
    if had_token:
        msg = ("Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other "
               "valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project.")
    else:
        msg = ("Request is missing required authentication credential. Expected OAuth 2 access token, login cookie or "
               "other valid authentication credential. See https://developers.google.com/identity/sign-in/web/"
               "devconsole-project.")
    err = http_error(401, msg, reason="authError" if had_token else "required")
    err.body["error"]["errors"][0].update({"location": "Authorization", "locationType": "header"})
    err.body["error"]["details"][0].update({"reason": "ACCESS_TOKEN_TYPE_UNSUPPORTED" if had_token
                                            else "CREDENTIALS_MISSING", "domain": "googleapis.com"})
    err.headers["WWW-Authenticate"] = 'Bearer realm="https://accounts.google.com/"'
    return err


def denied(path: str, permission: str) -> SimHttpError:
    """The 403 of ``path``'s API naming ``permission``."""
    service = service_of(path)
    if service == COMPUTE:
        parts = path.split("/compute/v1/", 1)[-1].split("/")
        if "aggregated" in parts:
            parts = parts[:2]
        elif parts[-1] in _VERBS:
            parts = parts[:-1]
        resource = "/".join(parts)
        err = http_error(403, f"Required '{permission}' permission for '{resource}'", reason="forbidden")
        del err.body["error"]["details"]  # Compute's v1 errors carry errors[], no ErrorInfo, for IAM refusals
        return err
    resource = path.split("/v1/", 1)[-1].split(":", 1)[0]
    if service == QUOTAS:
        full = f"//cloudquotas.googleapis.com/{resource}"
        err = http_error(403, f"Permission '{permission}' denied on resource '{full}' (or it may not exist).",
                         reason="IAM_PERMISSION_DENIED", domain="global",
                         metadata={"permission": permission, "resource": full})
        err.body["error"]["details"][0]["domain"] = "iam.googleapis.com"
        return err
    if "/clusters/" in resource:  # GKE checks node-pool calls on their cluster
        resource = resource.split("/nodePools", 1)[0]
    return http_error(403, f'Required "{permission}" permission(s) for "{resource}".', reason="forbidden")
