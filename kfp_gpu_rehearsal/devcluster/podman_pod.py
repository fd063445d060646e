"""One Deployment's container run by podman as a kubelet would run it: the local stand-in for "the Deployment runs
in the cluster" (KWOK nodes run no containers).

:func:`container_argv` renders the pod template's one container (image, command, args, env with the downward API's
``metadata.name`` / ``metadata.namespace``, the pod's and the container's securityContext, emptyDir mounts, the
memory limit) to ``podman run`` arguments. A field it cannot render fails in one line naming it, so a manifest
that grows a field this stand-in does not honour stops the test instead of being run without it.

The pod's credentials are what the kubelet mounts for its ServiceAccount: :func:`service_account_dir` writes a
token, the cluster's CA and the namespace to a directory that is mounted read-only at
``/var/run/secrets/kubernetes.io/serviceaccount``, with ``KUBERNETES_SERVICE_HOST`` / ``_PORT`` set: the process
finds in-cluster credentials exactly as in a pod (the host network stands in for the Service's ClusterIP).
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from kfp_gpu.errors import KfpGpuError

SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
POD_SECURITY = {"runAsNonRoot", "runAsUser", "runAsGroup", "seccompProfile"}
CONTAINER_KEYS = {"name", "image", "command", "args", "env", "ports", "resources", "securityContext", "volumeMounts"}
POD_KEYS = {"serviceAccountName", "securityContext", "affinity", "containers", "volumes"}


def _refuse(what: str, value: Any) -> KfpGpuError:
    return KfpGpuError(f"{what}={value!r}: the podman stand-in of the kubelet does not render it",
                       remediation="add it to kfp_gpu_rehearsal/devcluster/podman_pod.py, or drop it from the "
                       "manifest")


def _env(env: Sequence[Mapping[str, Any]], pod_name: str, namespace: str) -> list[str]:
    out = []
    for e in env:
        if "value" in e:
            out += ["--env", f"{e['name']}={e['value']}"]
            continue
        path = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if path not in ("metadata.name", "metadata.namespace"):
            raise _refuse(f"env {e.get('name')} valueFrom", e.get("valueFrom"))
        out += ["--env", f"{e['name']}={pod_name if path == 'metadata.name' else namespace}"]
    return out


def _security(pod: Mapping[str, Any], ctr: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    psc, csc = pod.get("securityContext") or {}, ctr.get("securityContext") or {}
    if unknown := set(psc) - POD_SECURITY:
        raise _refuse("pod securityContext", sorted(unknown))
    user = csc.get("runAsUser", psc.get("runAsUser"))
    if (csc.get("runAsNonRoot", psc.get("runAsNonRoot"))) and not user:
        raise _refuse("runAsNonRoot without runAsUser", True)  # the kubelet would check the image's USER
    if user is not None:
        out += ["--user", f"{user}:{csc.get('runAsGroup', psc.get('runAsGroup', user))}"]
    if (psc.get("seccompProfile") or {}).get("type") not in (None, "RuntimeDefault"):
        raise _refuse("seccompProfile", psc.get("seccompProfile"))
    for key, value in csc.items():
        if key == "allowPrivilegeEscalation" and value is False:
            out += ["--security-opt", "no-new-privileges"]
        elif key == "readOnlyRootFilesystem" and value is True:
            out += ["--read-only"]
        elif key == "capabilities" and set(value) <= {"drop"}:
            out += [f"--cap-drop={c}" for c in value.get("drop", [])]
        elif key not in ("runAsUser", "runAsGroup", "runAsNonRoot"):
            raise _refuse(f"container securityContext.{key}", value)
    return out


def container_argv(deployment: Mapping[str, Any], image: str, *, name: str, pod_name: str, sa_dir: Path,
                   server: str, args: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    """``podman run`` arguments for ``deployment``'s container as pod ``pod_name`` (container ``name``), with
    ``image`` for its image reference, ``args`` instead of the manifest's (None: the manifest's), ``env`` added
    (e.g. cloud credentials, which a Secret would hold), ``sa_dir`` mounted as the ServiceAccount's and ``server``
    (the API server's ``https://host:port``) as the in-cluster service."""
    tmpl = deployment["spec"]["template"]
    pod, namespace = tmpl["spec"], deployment["metadata"]["namespace"]
    if unknown := set(pod) - POD_KEYS:
        raise _refuse("pod spec", sorted(unknown))
    if len(pod["containers"]) != 1:
        raise _refuse("containers", [c.get("name") for c in pod["containers"]])
    ctr = pod["containers"][0]
    if unknown := set(ctr) - CONTAINER_KEYS:
        raise _refuse("container", sorted(unknown))
    empty = {v["name"] for v in pod.get("volumes", []) if set(v) == {"name", "emptyDir"}}
    url = urlparse(server)
    argv = ["run", "--detach", "--name", name, "--network", "host", "--hostname", pod_name,
            "--env", f"KUBERNETES_SERVICE_HOST={url.hostname}", "--env", f"KUBERNETES_SERVICE_PORT={url.port}",
            "--volume", f"{sa_dir}:{SA_MOUNT}:ro", *_security(pod, ctr), *_env(ctr.get("env", []), pod_name, namespace)]
    for m in ctr.get("volumeMounts", []):
        if m["name"] not in empty:
            raise _refuse(f"volumeMount {m['name']}", "not an emptyDir")
        argv += ["--tmpfs", f"{m['mountPath']}:rw,mode=1777"]
    if mem := ((ctr.get("resources") or {}).get("limits") or {}).get("memory"):
        argv += ["--memory", str(mem).replace("Gi", "g").replace("Mi", "m")]
    for k, v in (env or {}).items():
        argv += ["--env", f"{k}={v}"]
    if ctr.get("command"):
        argv += ["--entrypoint", ctr["command"][0]]
    return [*argv, image, *ctr.get("command", [])[1:], *(ctr.get("args", []) if args is None else args)]


def deployment(manifest: Path) -> dict[str, Any]:
    """The one Deployment of a multi-document manifest."""
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d and d.get("kind") == "Deployment"]
    if len(docs) != 1:
        raise KfpGpuError(f"{manifest}: {len(docs)} Deployments, expected 1", remediation="keep one per manifest")
    return dict(docs[0])


def service_account_dir(path: Path, token: str, kubeconfig: Path, namespace: str) -> tuple[Path, str]:
    """Write what the kubelet mounts for a ServiceAccount (``token``, ``ca.crt``, ``namespace``) to ``path``,
    readable by any user (the container runs as a non-root uid); returns it and the API server's URL."""
    kc = yaml.safe_load(kubeconfig.read_text())
    cluster = kc["clusters"][0]["cluster"]
    ca = (base64.b64decode(cluster["certificate-authority-data"]) if "certificate-authority-data" in cluster
          else Path(cluster["certificate-authority"]).read_bytes())
    path.mkdir(parents=True, exist_ok=True)
    (path / "token").write_text(token)
    (path / "ca.crt").write_bytes(ca)
    (path / "namespace").write_text(namespace)
    for p in (path, *path.iterdir()):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return path, str(cluster["server"])


def podman(argv: Sequence[str], env: Mapping[str, str], check: bool = True,
           timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *argv], env=dict(env), capture_output=True, text=True, check=check,  # noqa: S603,S607
                          timeout=timeout_s)
