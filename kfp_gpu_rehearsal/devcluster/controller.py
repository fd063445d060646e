"""The kfp-gpu controller as a local process on the dev cluster, under its own ServiceAccount token, and the
tenant step identity beside it: what the dev cluster's controller row (which ``kfp-gpu run`` and ``make demo`` use)
and the integration tier run.

:func:`prepare` installs the CRDs, the controller's RBAC and the admission policy (``kfp-gpu install
--no-controller``) and makes ``namespace`` a tenant (``kfp-gpu tenant add``); :func:`sa_kubeconfig` mints a
TokenRequest token into a kubeconfig; :class:`LocalController` runs ``kfp-gpu controller --standalone`` with the
controller's token as its only Kubernetes credentials and the stand-ins' controller credentials
(:func:`kfp_gpu.iam.sim_controller_env`) as its cloud identity.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from kfp_gpu import iam
from kfp_gpu.gang import api as gang


def sa_kubeconfig(admin: client.ApiClient, namespace: str, sa: str, path: Path, ttl_s: int = 86400) -> Path:
    """A kubeconfig at ``path`` whose only credential is a fresh TokenRequest token of ``namespace/sa``.
    Raises: ApiException."""
    return token_kubeconfig(admin, namespace, sa, mint_token(admin, namespace, sa, ttl_s), path)


def mint_token(admin: client.ApiClient, namespace: str, sa: str, ttl_s: int = 86400) -> str:
    """A TokenRequest token of ``namespace/sa``. Raises: ApiException."""
    req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[],
                                                                             expiration_seconds=ttl_s))
    return str(client.CoreV1Api(admin).create_namespaced_service_account_token(sa, namespace, req).status.token)


def token_kubeconfig(admin: client.ApiClient, namespace: str, sa: str, token: str, path: Path) -> Path:
    """Write a kubeconfig for ``admin``'s API server whose only credential is ``token`` (mode 0600)."""
    src = admin.configuration
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "kfp-gpu", "cluster": {"server": src.host, "certificate-authority": src.ssl_ca_cert}}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "kfp-gpu", "user": sa, "namespace": namespace}}],
    }))
    path.chmod(0o600)
    return path


def prepare(admin: client.ApiClient, namespace: str, workdir: Path, **limits: Any) -> tuple[Path, Path]:
    """Install (no Deployment), make ``namespace`` a tenant, and return (controller kubeconfig, step kubeconfig)."""
    step = prepare_tenant(admin, namespace, workdir, **limits)
    ctl = sa_kubeconfig(admin, gang.CONTROLLER_NAMESPACE, gang.CONTROLLER_SA, workdir / "kubeconfig-controller")
    return ctl, step


def prepare_tenant(admin: client.ApiClient, namespace: str, workdir: Path, **limits: Any) -> Path:
    """Install (no Deployment), make ``namespace`` a tenant with ``limits``, and return the step kubeconfig (its
    ``kfp-gpu`` ServiceAccount's token): what a run needs when the dev cluster's controller row serves it."""
    from kfp_gpu import install

    install.apply(admin, controller=False, autoscaler_status=True)  # the dev cluster's autoscaler is self-managed
    install.tenant_add(admin, namespace, **limits)
    return sa_kubeconfig(admin, namespace, gang.STEP_SA, workdir / f"kubeconfig-{namespace}-{gang.STEP_SA}")


def peak_rss_mib(pid: int) -> float:
    """A process's peak resident set (VmHWM) so far; 0 when it is not running."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


class LocalController:
    """``kfp-gpu controller --standalone`` in a child process with ``kubeconfig`` as its only credentials.

    ``lease`` names the leader-election Lease (in kfp-gpu-system): the process is then one replica of the Deployment
    (``--leader-elect-resource-name``, as kfp_gpu/manifests/controller.yaml runs it, ``POD_NAME`` = ``replica``)
    instead of the only one; ``lease_timings`` (lease duration, renew deadline, retry period, seconds) shorten the
    election for a test."""

    def __init__(self, kubeconfig: Path, namespaces: Sequence[str], log_path: Path,
                 env: Mapping[str, str] | None = None, metrics_port: int = 0, *, lease: str = "",
                 replica: str = "", lease_timings: tuple[int, float, float] | None = None) -> None:
        self.kubeconfig, self.namespaces, self.log_path = kubeconfig, list(namespaces), log_path
        self.env = dict(os.environ if env is None else env)
        self.metrics_port, self.lease, self.replica, self.lease_timings = metrics_port, lease, replica, lease_timings
        self.proc: subprocess.Popen[bytes] | None = None
        self.last_peak_rss_mib = 0.0

    def argv(self) -> list[str]:
        """The controller's command line (the Deployment's ``kfp-gpu controller``, namespaced, local)."""
        mode = ["--leader-elect-resource-name", self.lease] if self.lease else ["--standalone"]
        if self.lease and self.lease_timings:
            mode += [f"--leader-elect-{flag}={value}" for flag, value in
                     zip(("lease-duration", "renew-deadline", "retry-period"), self.lease_timings, strict=True)]
        argv = [sys.executable, "-m", "kfp_gpu.cli", "controller", *mode, "--metrics-port", str(self.metrics_port),
                "--log-dir", str(self.log_path.parent / "controller-work")]
        for ns in self.namespaces:
            argv += ["--namespace", ns]
        return argv

    def identity_env(self) -> dict[str, str]:
        """What the process gets on top of its base environment: the controller's ServiceAccount kubeconfig as its
        only Kubernetes credentials, and the stand-ins' controller credentials (deploy/gcp-role.yaml,
        deploy/aws-policy.json): the controller holds the cloud identity, the steps none."""
        return {**iam.sim_controller_env(), "KUBECONFIG": str(self.kubeconfig),
                **({"POD_NAME": self.replica} if self.replica else {})}

    def start(self) -> LocalController:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), env={**self.env, **self.identity_env()},  # noqa: S603
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """``kill -9``: no cleanup at all (its work units die with it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def peak_rss_mib(self) -> float:
        """The controller process's peak resident set (VmHWM) so far; 0 when it is not running."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        return peak_rss_mib(self.proc.pid)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.last_peak_rss_mib = self.peak_rss_mib()
        self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.proc.poll() is None:
            self.kill()

    def __enter__(self) -> LocalController:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
