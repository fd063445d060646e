"""IAM of the AWS stand-in: SigV4 access key id -> principal (an IAM user) -> allowed actions, checked on every call.

The default principal (access key :data:`kfp_gpu.iam.SIM_AWS_KEY_ID`) is allowed exactly the actions of
``deploy/aws-policy.json``, :data:`QUOTA_KEY_ID` those of ``deploy/aws-quota-requester-policy.json``; tests give other
keys other sets (``AwsSimServer.grant``). An action is ``<signing name>:<Operation>``, as the provider names it
(:data:`kfp_gpu.iam.AWS_PREFIX`), plus the implied ones (:data:`kfp_gpu.iam.AWS_IMPLIED`: tag on create). Refusals
are AWS's (docs/sim.md, "Credentials and IAM"): unsigned -> ``MissingAuthenticationToken``; unknown key ->
``AuthFailure`` (EC2) / ``InvalidClientTokenId`` (Auto Scaling) / ``UnrecognizedClientException`` (JSON APIs);
denied -> ``UnauthorizedOperation`` (EC2, 403), ``AccessDenied`` (Auto Scaling, 403), ``AccessDeniedException``
(EKS 403, Service Quotas 400), each message naming the user and the action. Signatures are not verified.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable

from kfp_gpu import iam

QUOTA_KEY_ID = "AKIAKFPGPUSIMQUOTARQ"
_KEY = re.compile(r"Credential=([^/,\s]+)/")
_UNSIGNED = {"ec2": ("MissingAuthenticationToken", "The request must contain either a valid (registered) AWS access "
                     "key ID or X.509 certificate.", 401),
             "autoscaling": ("MissingAuthenticationToken", "Request is missing Authentication Token", 403),
             "eks": ("MissingAuthenticationTokenException", "Missing Authentication Token", 403),
             "servicequotas": ("MissingAuthenticationTokenException", "Missing Authentication Token", 400)}
_UNKNOWN = {"ec2": ("AuthFailure", "AWS was not able to validate the provided access credentials", 401),
            "autoscaling": ("InvalidClientTokenId", "The security token included in the request is invalid.", 403),
            "eks": ("UnrecognizedClientException", "The security token included in the request is invalid.", 403),
            "servicequotas": ("UnrecognizedClientException", "The security token included in the request is invalid.",
                              400)}
_DENIED = {"ec2": ("UnauthorizedOperation", 403), "autoscaling": ("AccessDenied", 403),
           "eks": ("AccessDeniedException", 403), "servicequotas": ("AccessDeniedException", 400)}


class Refusal(Exception):
    def __init__(self, code: str, message: str, status: int) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


class Principals:
    """Access key id -> (user name, allowed actions). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, tuple[str, frozenset[str]]] = {
            iam.SIM_AWS_KEY_ID: ("kfp-gpu-controller", iam.aws_actions(iam.AWS_POLICY)),
            QUOTA_KEY_ID: ("kfp-gpu-quota-requester", iam.aws_actions(iam.AWS_QUOTA_POLICY)),
        }

    def grant(self, key_id: str, actions: Iterable[str], user: str = "") -> None:
        """Give access key ``key_id`` exactly ``actions`` (replacing what it had)."""
        with self._lock:
            self._keys[key_id] = (user or key_id.lower(), frozenset(actions))

    def check(self, service: str, action: str, authorization: str, *, region: str, tagged: bool = False) -> None:
        """Raises: Refusal (AWS's error for ``service``) unless the caller may call ``service:action``;
        ``tagged``: the request tags the resource it creates (AWS then also checks the implied actions)."""
        m = _KEY.search(authorization or "")
        if m is None:
            raise Refusal(*_UNSIGNED.get(service, _UNSIGNED["eks"]))
        with self._lock:
            found = self._keys.get(m.group(1))
        if found is None:
            raise Refusal(*_UNKNOWN.get(service, _UNKNOWN["eks"]))
        user, allowed = found
        wanted = f"{service}:{action}"
        needed = [wanted, *(iam.AWS_IMPLIED.get(wanted, ()) if tagged else ())]
        missing = next((a for a in needed if a not in allowed), None)
        if missing is None:
            return
        code, status = _DENIED.get(service, ("AccessDeniedException", 403))
        arn = f"arn:aws:iam::{iam.SIM_ACCOUNT}:user/{user}"
        resource = f"arn:aws:{service}:{region}:{iam.SIM_ACCOUNT}:*"
        text = (f"User: {arn} is not authorized to perform: {missing} on resource: {resource} because no "
                f"identity-based policy allows the {missing} action")
        if service == "ec2":
            text = f"You are not authorized to perform this operation. {text}"
        raise Refusal(code, text, status)
