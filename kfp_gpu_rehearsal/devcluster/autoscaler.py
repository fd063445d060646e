"""Build and run the real cluster-autoscaler (kwok cloud provider) against the dev cluster.

Used by the benchmarks (``bench/``) as the baseline for burst scale-up (:class:`Autoscaler`), and by the dev
cluster's cluster-autoscaler profile (:mod:`kfp_gpu_rehearsal.devcluster.ca_profile`: ``up --autoscaler cluster-autoscaler``),
which serves ProvisioningRequests. The two use different provider/status ConfigMaps, ports and logs.

Build: ``k8s.io/autoscaler/cluster-autoscaler`` at ``CLUSTER_AUTOSCALER_VERSION`` (versions.env) is built
with ``-tags kwok`` in a wrapper module under ``<cache>/build/``. The upstream go.mod's requires and
module replaces are copied into the wrapper (replace directives are only honoured in the main module);
its local-path replace ``k8s.io/autoscaler/cluster-autoscaler/apis => ./apis`` is dropped, so the
``apis`` module resolves to the version upstream requires. The binary lands in
``<cache>/bin/cluster-autoscaler-<version>``. The sum database does not list the pinned pseudo-version, so
the build sets ``GONOSUMDB`` for that one module path (the proxy still serves it; go.sum pins it locally).

Run: :func:`install_provider_config` writes the ConfigMaps the kwok provider reads
(``kube-system/kwok-provider-config`` and ``kube-system/kwok-provider-templates``);
:class:`Autoscaler` starts the binary with ``--cloud-provider=kwok`` and stops it (by its own pid).

    python -m kfp_gpu_rehearsal.devcluster.autoscaler build     # build into the cache (skips when present)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import gobuild
from .versions import binary_path, cache_dir, load_versions

MODULE = "k8s.io/autoscaler/cluster-autoscaler"
NAME = "cluster-autoscaler"
NAMESPACE = "kube-system"
CONFIG_CM = "kwok-provider-config"
TEMPLATES_CM = "kwok-provider-templates"
DEFAULT_HEALTH_PORT = 18085
BENCH_STATUS_CM = "kfp-gpu-bench-ca-status"


class AutoscalerError(RuntimeError):
    """Building or running cluster-autoscaler failed (never skipped silently)."""


def version() -> str:
    """The pinned version. Raises: AutoscalerError when versions.env has no value."""
    v = load_versions().get("CLUSTER_AUTOSCALER_VERSION", "").strip()
    if not v:
        raise AutoscalerError("CLUSTER_AUTOSCALER_VERSION is empty in kfp_gpu_rehearsal/devcluster/versions.env")
    return v


def binary() -> Path:
    return binary_path(NAME, version())


def go_env() -> dict[str, str]:
    """The build environment (the pinned pseudo-version is not in the checksum database)."""
    return gobuild.go_env(nosum=(MODULE,))


def _run(cmd: Sequence[str], cwd: Path, log: Path) -> str:
    return gobuild.run(cmd, cwd, log, AutoscalerError, nosum=(MODULE,))




SRC_DIR = "ca-src"
# The kwok provider builds its own client with client-go's default rate limit (5 QPS, burst 10) and creates
# one Node per API call, so a 128-node scale-up would take ~25 s of client-side throttling - an artefact of
# the simulation (a real cloud provider resizes an instance group in one call). The only source change:
# lift that limit, in the baseline's favour.
KWOK_PATCH_FILE = "cloudprovider/kwok/kwok_provider.go"
KWOK_PATCH_ANCHOR = "\tkubeClient := kubeclient.NewForConfigOrDie(restConfig)\n"
KWOK_PATCH = "\trestConfig.QPS, restConfig.Burst = 1000, 2000 // kfp-gpu bench: no client-side throttling\n"


def _patched_copy(src: Path, dst: Path) -> None:
    """Copy the upstream module source to ``dst`` (writable) and apply :data:`KWOK_PATCH`.

    Raises: AutoscalerError when the anchor line is not found (the pinned version changed).
    """
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*_test.go", "testdata"))
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    f = dst / KWOK_PATCH_FILE
    text = f.read_text()
    if text.count(KWOK_PATCH_ANCHOR) != 1:
        raise AutoscalerError(f"{KWOK_PATCH_FILE}: patch anchor not found; review KWOK_PATCH for this version")
    f.write_text(text.replace(KWOK_PATCH_ANCHOR, KWOK_PATCH + KWOK_PATCH_ANCHOR))


APIS_MODULE = MODULE + "/apis"
APIS_DIR = "ca-apis"


def _apis_v1_copy(src: Path, dst: Path) -> None:
    """The ``apis`` module for the build.

    Upstream builds with ``apis => ./apis`` (a nested module, not in the module zip); the version its go.mod
    requires (and the only one the module proxy serves) predates the ProvisioningRequest ``v1`` API that the
    autoscaler imports, and has the identical ``v1beta1`` API. The autoscaler imports only ``v1``, so the copy
    renames ``v1beta1`` to ``v1`` throughout (directories, packages, group-version strings, clientset methods).
    The CRD is renamed the same way (:mod:`kfp_gpu_rehearsal.devcluster.provreq_crd`).
    """
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*_test.go", "testdata"))
    for p in sorted(dst.rglob("*"), key=lambda x: -len(x.parts)):
        p.chmod(0o755 if p.is_dir() else 0o644)
        if p.is_file() and p.suffix == ".go":
            p.write_text(_rename_v1beta1(p.read_text()))
        if p.is_dir() and p.name == "v1beta1":
            p.rename(p.with_name("v1"))
    dst.chmod(0o755)
    (dst / "provisioningrequest" / "autoscaling.x-k8s.io" / "v1" / "kfpgpu_compat.go").write_text(APIS_COMPAT)


# Constants the autoscaler imports that were added to the v1 API after the required apis version.
APIS_COMPAT = """package v1

const (
\t// ProvisioningRequestPodAnnotationKey is a key used to annotate pods consuming provisioning request.
\tProvisioningRequestPodAnnotationKey = "autoscaling.x-k8s.io/consume-provisioning-request"
\t// ProvisioningClassPodAnnotationKey is a key used to add annotation about Provisioning Class.
\tProvisioningClassPodAnnotationKey = "autoscaling.x-k8s.io/provisioning-class-name"
)
"""


def _rename_v1beta1(src: str) -> str:
    """v1beta1 -> v1 in import paths, package clauses, group versions and method names; Go identifiers that
    qualify the imported package keep the name ``v1beta1`` (an import alias), so nothing clashes with metav1."""
    lines = []
    for line in src.splitlines(keepends=True):
        s = line.strip()
        if s.startswith("package v1beta1"):
            line = line.replace("package v1beta1", "package v1")
        elif "cluster-autoscaler/apis/" in s and "/v1beta1" in s and s.endswith('"'):
            path = s[s.index('"'):].replace("/v1beta1/", "/v1/").replace('/v1beta1"', '/v1"')
            alias = s[:s.index('"')].strip().removeprefix("import").strip()
            if not alias and s.endswith('/v1beta1"'):
                alias = "v1beta1"
            line = line[: len(line) - len(line.lstrip())] + ("import " if s.startswith("import") else "") \
                + (f"{alias} " if alias else "") + f"{path}\n"
        else:
            line = line.replace('"autoscaling.x-k8s.io/v1beta1"', '"autoscaling.x-k8s.io/v1"')
            line = line.replace('"v1beta1"', '"v1"').replace("V1beta1", "V1")
        lines.append(line)
    return "".join(lines)


def wrapper_gomod(upstream: Mapping[str, Any], ver: str, *, local_src: str = "") -> str:
    """The wrapper module's go.mod (:func:`kfp_gpu_rehearsal.devcluster.gobuild.wrapper_gomod`)."""
    return gobuild.wrapper_gomod(upstream, MODULE, ver, NAME, local_src=local_src)


def build(*, wait_for_others: bool = True, poll_s: float = 10.0) -> Path:
    """Build cluster-autoscaler (-tags kwok) into the cache; a present binary is reused.

    Raises: AutoscalerError (missing toolchain, download or compile failure).
    """
    ver = version()
    out = binary_path(NAME, ver)
    if out.exists():
        return out
    if shutil.which("go") is None:
        raise AutoscalerError("the Go toolchain ('go') is not on PATH")
    work = cache_dir() / "build" / f"{MODULE.replace('/', '_')}-{ver}"
    work.mkdir(parents=True, exist_ok=True)
    log = cache_dir() / "build" / f"{NAME}-{ver}.log"
    if not (work / "go.mod").exists():
        _run(["go", "mod", "download", f"{MODULE}@{ver}"], work, log)
        modcache = Path(_run(["go", "env", "GOMODCACHE"], work, log).strip())
        src = modcache / f"{MODULE}@{ver}"
        upstream = json.loads(_run(["go", "mod", "edit", "-json", str(src / "go.mod")], work, log))
        _patched_copy(src, work / SRC_DIR)
        apis_ver = next(r["Version"] for r in upstream.get("Require") or [] if r["Path"] == APIS_MODULE)
        _run(["go", "mod", "download", f"{APIS_MODULE}@{apis_ver}"], work, log)
        _apis_v1_copy(modcache / f"{APIS_MODULE}@{apis_ver}", work / APIS_DIR)
        (work / "go.mod").write_text(wrapper_gomod(upstream, ver, local_src=f"./{SRC_DIR}")
                                     + f"\nreplace {APIS_MODULE} => ./{APIS_DIR}\n")
    return gobuild.go_build("autoscaler", MODULE, out, work, log, AutoscalerError,
                            flags=("-ldflags", "-s -w", "-tags", "kwok"), what=f"{MODULE}@{ver} -tags kwok",
                            wait_for_others=wait_for_others, poll_s=poll_s, nosum=(MODULE,))


# ---- provider configuration ---------------------------------------------------------------------

def provider_config(*, group_label: str, gpu_label: str, gpu_types: Sequence[str],
                    templates_cm: str = TEMPLATES_CM) -> str:
    """The kwok provider's config (templates from ConfigMap ``templates_cm``, node groups by ``group_label``)."""
    types = "".join(f'      "{t}": {{}}\n' for t in gpu_types)
    return (
        "apiVersion: v1alpha1\n"
        "readNodesFrom: configmap\n"
        "nodegroups:\n"
        f'  fromNodeLabelKey: "{group_label}"\n'
        "nodes:\n"
        "  skipTaint: true\n"
        "  gpuConfig:\n"
        f'    gpuLabelKey: "{gpu_label}"\n'
        "    availableGPUTypes:\n"
        f"{types}"
        "configmap:\n"
        f"  name: {templates_cm}\n"
    )


def install_provider_config(core: Any, templates: Sequence[Mapping[str, Any]], *, group_label: str,
                            gpu_label: str, gpu_types: Sequence[str], config_cm: str = CONFIG_CM,
                            templates_cm: str = TEMPLATES_CM) -> None:
    """Create or replace the two ConfigMaps in kube-system. ``core`` is a ``CoreV1Api``.

    CA reads ``config_cm`` from its ``KWOK_PROVIDER_CONFIGMAP`` environment variable (:func:`base_env`).

    Raises: kubernetes.client.ApiException (other than the 404 of a first install).
    """
    from kubernetes.client import ApiException

    docs = {"apiVersion": "v1", "kind": "List", "items": list(templates)}
    data = {
        config_cm: {"config": provider_config(group_label=group_label, gpu_label=gpu_label, gpu_types=gpu_types,
                                              templates_cm=templates_cm)},
        templates_cm: {"templates": json.dumps(docs)},
    }
    for name, payload in data.items():
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NAMESPACE},
                "data": payload}
        try:
            core.replace_namespaced_config_map(name, NAMESPACE, body)
        except ApiException as exc:
            if exc.status != 404:
                raise
            core.create_namespaced_config_map(NAMESPACE, body)


# ---- process -------------------------------------------------------------------------------------

def base_argv(binary_: Path, kubeconfig: Path, health_port: int) -> list[str]:
    """The kwok-provider basics: out of cluster, no leader election, health on 127.0.0.1:``health_port``."""
    return [str(binary_), "--cloud-provider=kwok", f"--kubeconfig={kubeconfig}", "--leader-elect=false",
            f"--address=127.0.0.1:{health_port}", "--namespace=" + NAMESPACE, "--v=1"]


def base_env(kubeconfig: Path, config_cm: str = CONFIG_CM) -> dict[str, str]:
    """Environment the kwok provider reads: its namespace, local mode (KUBECONFIG), its config ConfigMap."""
    return {"POD_NAMESPACE": NAMESPACE, "KWOK_PROVIDER_MODE": "local", "KUBECONFIG": str(kubeconfig),
            "KWOK_PROVIDER_CONFIGMAP": config_cm}


class Autoscaler:
    """A cluster-autoscaler process (kwok provider) against ``kubeconfig``.

    Args:
        kubeconfig: admin kubeconfig of the dev cluster.
        extra_args: more flags (e.g. ``--scan-interval=1s``).
        log_path: where stdout/stderr go.
    """

    def __init__(self, kubeconfig: Path, *, extra_args: Sequence[str] = (), log_path: Path | None = None,
                 health_port: int = DEFAULT_HEALTH_PORT) -> None:
        self.kubeconfig = kubeconfig
        self.extra_args = list(extra_args)
        self.log_path = log_path or (cache_dir() / "cluster" / "bench-cluster-autoscaler.log")
        self.health_port = health_port
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        # Its own status ConfigMap: the dev cluster's cluster-autoscaler profile (ca_profile.py) owns the
        # default one, which CA deletes on exit and the provisioning-request backend reads.
        return [*base_argv(binary(), self.kubeconfig, self.health_port),
                f"--status-config-map-name={BENCH_STATUS_CM}", *self.extra_args]

    def start(self, *, timeout_s: float = 60.0) -> None:
        """Start and wait until ``/health-check`` answers 200.

        Raises: AutoscalerError when the binary is missing, exits, or never turns healthy.
        """
        if not binary().exists():
            raise AutoscalerError(f"{binary()} is missing: run `python -m kfp_gpu_rehearsal.devcluster.autoscaler build`")
        env = {**os.environ, **base_env(self.kubeconfig)}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        fh = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.argv(), stdout=fh, stderr=subprocess.STDOUT, env=env)
        fh.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AutoscalerError(f"cluster-autoscaler exited with {self.proc.returncode}; "
                                      f"last log lines:\n{self.log_tail()}")
            if self.healthy():
                return
            time.sleep(0.2)
        self.stop()
        raise AutoscalerError(f"cluster-autoscaler not healthy after {timeout_s:g}s:\n{self.log_tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/health-check", timeout=1) as r:
                return int(r.status) == 200
        except OSError:
            return False

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop our own process (SIGTERM, then SIGKILL)."""
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=timeout_s)

    def __enter__(self) -> Autoscaler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    return gobuild.cli_main("autoscaler", "autoscaler", build, AutoscalerError, argv)


if __name__ == "__main__":
    sys.exit(main())
