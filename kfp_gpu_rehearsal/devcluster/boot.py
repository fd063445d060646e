"""Boot / stop / inspect the local control plane (``up``, ``down``, ``status``).

Order: etcd -> kube-apiserver -> kube-controller-manager, kube-scheduler ->
(CRDs + webhook plumbing) -> KWOK -> Training Operator v1.  Every listener is on
127.0.0.1 except the Training Operator's webhook server, whose bind host is not
configurable upstream (port only).  State, logs, pid files, PKI and the admin
kubeconfig live in ``${KFP_GPU_CACHE:-~/.cache/kfp-gpu}/cluster``.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from . import crds, procs, runner
from .certs import CertError, ensure_pki
from .procs import BootError
from .runner import Component, Ctx, Unit
from .versions import Versions, binaries, cluster_dir, share_dir

STAGES_FILE = Path(__file__).with_name("kwok") / "stages.yaml"
KWOK_CONFIG_FILE = Path(__file__).with_name("kwok") / "kwok.yaml"
# training-operator v1.9's cert rotator only checks that <ROTATOR_CERT_DIR>/tls.crt exists (path hard-coded),
# while its webhook server reads the certs from $TMPDIR/k8s-webhook-server/serving-certs (controller-runtime
# default). We point TMPDIR at the cluster dir so each cluster serves its own cert, and make sure the
# hard-coded path has *a* tls.crt.
ROTATOR_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")


def webhook_cert_dir(state: Path) -> Path:
    return state / "tmp" / "k8s-webhook-server" / "serving-certs"

# name -> (env var, default). Override e.g. KFP_GPU_APISERVER_PORT=26443.
PORT_DEFAULTS: dict[str, tuple[str, int]] = {
    "etcd": ("KFP_GPU_ETCD_PORT", 23790),
    "etcd-peer": ("KFP_GPU_ETCD_PEER_PORT", 23800),
    "apiserver": ("KFP_GPU_APISERVER_PORT", 16443),
    "controller-manager": ("KFP_GPU_CONTROLLER_MANAGER_PORT", 16257),
    "scheduler": ("KFP_GPU_SCHEDULER_PORT", 16259),
    "kwok": ("KFP_GPU_KWOK_PORT", 16247),
    "operator-metrics": ("KFP_GPU_OPERATOR_METRICS_PORT", 16080),
    "operator-probe": ("KFP_GPU_OPERATOR_PROBE_PORT", 16081),
    "operator-webhook": ("KFP_GPU_OPERATOR_WEBHOOK_PORT", 19443),
}


def ports() -> dict[str, int]:
    return runner.env_ports(PORT_DEFAULTS)


def kubeconfig_path() -> Path:
    return cluster_dir() / "kubeconfig"


def _etcd(c: Ctx) -> list[str]:
    url, peer = f"http://127.0.0.1:{c.ports['etcd']}", f"http://127.0.0.1:{c.ports['etcd-peer']}"
    return [str(c.bins["etcd"]), "--name=kfp-gpu", f"--data-dir={c.state / 'etcd'}",
            f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=kfp-gpu={peer}", "--unsafe-no-fsync", "--log-level=warn",
            "--quota-backend-bytes=8589934592"]


def _apiserver(c: Ctx) -> list[str]:
    p = c.pki
    return [str(c.bins["kube-apiserver"]), f"--etcd-servers=http://127.0.0.1:{c.ports['etcd']}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={c.ports['apiserver']}",
            f"--tls-cert-file={p / 'apiserver.crt'}", f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}", "--authorization-mode=RBAC",
            f"--requestheader-client-ca-file={p / 'ca.crt'}", "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p / 'sa.pub'}", f"--service-account-signing-key-file={p / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16", "--allow-privileged=true", "--profiling=false",
            "--max-requests-inflight=1000", "--max-mutating-requests-inflight=500", "--event-ttl=1h", "--v=1"]


def _component_auth(c: Ctx, name: str) -> list[str]:
    kc = str(c.kubeconfig)
    return [f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", f"--secure-port={c.ports[name]}", "--leader-elect=false", "--v=1"]


def _controller_manager(c: Ctx) -> list[str]:
    return [str(c.bins["kube-controller-manager"]), *_component_auth(c, "controller-manager"),
            f"--service-account-private-key-file={c.pki / 'sa.key'}", f"--root-ca-file={c.pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={c.pki / 'ca.crt'}", f"--cluster-signing-key-file={c.pki / 'ca.key'}",
            "--node-monitor-period=2s", "--kube-api-qps=200", "--kube-api-burst=400",
            "--concurrent-gc-syncs=20", "--concurrent-job-syncs=10"]


def _scheduler(c: Ctx) -> list[str]:
    return [str(c.bins["kube-scheduler"]), *_component_auth(c, "scheduler"),
            "--kube-api-qps=200", "--kube-api-burst=400"]


def _kwok(c: Ctx) -> list[str]:
    return [str(c.bins["kwok"]), f"--kubeconfig={c.kubeconfig}", f"--config={KWOK_CONFIG_FILE}",
            f"--config={STAGES_FILE}",
            "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--cidr=10.240.0.1/12", "--node-ip=10.239.0.1", f"--server-address=127.0.0.1:{c.ports['kwok']}"]


def _operator(c: Ctx) -> list[str]:
    return [str(c.bins["training-operator"]), f"--kubeconfig={c.kubeconfig}", "--enable-scheme=pytorchjob",
            f"--metrics-bind-address=127.0.0.1:{c.ports['operator-metrics']}",
            f"--health-probe-bind-address=127.0.0.1:{c.ports['operator-probe']}",
            f"--webhook-server-port={c.ports['operator-webhook']}", "--leader-elect=false",
            "--controller-threads=4", "--kube-api-qps=100", "--kube-api-burst=200"]


def _https(port_key: str, path: str) -> Callable[[Ctx], bool]:
    return lambda c: procs.http_ok(f"https://127.0.0.1:{c.ports[port_key]}{path}", procs.insecure_ctx())


COMPONENTS: tuple[Component, ...] = (
    Component("etcd", ("etcd", "etcd-peer"), _etcd,
              lambda c: procs.http_ok(f"http://127.0.0.1:{c.ports['etcd']}/health")),
    Component("kube-apiserver", ("apiserver",), _apiserver,
              lambda c: procs.http_ok(f"https://127.0.0.1:{c.ports['apiserver']}/readyz", procs.client_ctx(c.pki)),
              timeout=120.0),
    Component("kube-controller-manager", ("controller-manager",), _controller_manager,
              _https("controller-manager", "/healthz")),
    Component("kube-scheduler", ("scheduler",), _scheduler, _https("scheduler", "/healthz")),
    Component("kwok", ("kwok",), _kwok, lambda c: procs.http_ok(f"http://127.0.0.1:{c.ports['kwok']}/healthz"),
              before=lambda c: _install_operator_crds(c)),  # CRDs + webhook plumbing before the operator starts
    Component("training-operator", ("operator-metrics", "operator-probe", "operator-webhook"), _operator,
              lambda c: procs.http_ok(f"http://127.0.0.1:{c.ports['operator-probe']}/readyz"), timeout=90.0,
              env=lambda c: {"TMPDIR": str(c.state / "tmp")}),
)


def write_kubeconfig(c: Ctx) -> None:
    p = c.pki
    kc = f"""apiVersion: v1
kind: Config
clusters:
- name: kfp-gpu
  cluster:
    server: https://127.0.0.1:{c.ports['apiserver']}
    certificate-authority: {p / 'ca.crt'}
users:
- name: kfp-gpu-admin
  user:
    client-certificate: {p / 'admin.crt'}
    client-key: {p / 'admin.key'}
contexts:
- name: kfp-gpu
  context: {{cluster: kfp-gpu, user: kfp-gpu-admin}}
current-context: kfp-gpu
"""
    c.kubeconfig.write_text(kc)


def _ctx() -> Ctx:
    v = Versions.load()
    state = cluster_dir()
    return Ctx(state=state, pki=state / "pki", bins=binaries(v), ports=ports(), versions=v)


def _check_binaries(c: Ctx) -> None:
    missing = [str(b) for b in c.bins.values() if not b.exists()]
    if missing:
        raise BootError("missing binaries (run `python -m kfp_gpu_rehearsal.devcluster build`):\n  " + "\n  ".join(missing))


def _check_ports_consistent(c: Ctx) -> None:
    f = c.state / "state.json"
    if not f.exists():
        return
    old = json.loads(f.read_text()).get("ports", {})
    if old and old != c.ports and any(procs.running_pid(c.state, x.name, c.bins[x.name]) for x in COMPONENTS):
        raise BootError(f"a cluster is already running with ports {old}; run `down` before changing ports")


def _prepare_webhook_certs(c: Ctx) -> None:
    d = webhook_cert_dir(c.state)
    d.mkdir(parents=True, exist_ok=True)
    for src, dst in (("webhook.crt", "tls.crt"), ("webhook.key", "tls.key")):
        shutil.copyfile(c.pki / src, d / dst)
    if not (ROTATOR_CERT_DIR / "tls.crt").exists():
        ROTATOR_CERT_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(c.pki / "webhook.crt", ROTATOR_CERT_DIR / "tls.crt")


def _wait_default_sa(c: Ctx, timeout: float = 60.0) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(crds.api_client(c.kubeconfig))

    def ok() -> bool:
        try:
            core.read_namespaced_service_account("default", "default")
            return True
        except ApiException:
            return False

    procs.wait_for("default serviceaccount", ok, timeout, c.state / "kube-controller-manager.log")


def _record_identity(c: Ctx) -> None:
    """Name this control plane as the kfp-gpu dev cluster (kfp_gpu.cluster.identity reads it back)."""
    from kfp_gpu.cluster.identity import record_local

    record_local(crds.api_client(c.kubeconfig), f"https://127.0.0.1:{c.ports['apiserver']}")


def _install_operator_crds(c: Ctx) -> None:
    crds.install(crds.api_client(c.kubeconfig), share_dir("training-operator", c.versions.training_operator), c.pki,
                 c.ports["operator-webhook"])


def _core_after(c: Ctx) -> str:
    crds.install_provreq(crds.api_client(c.kubeconfig))  # GKE serves this CRD in every cluster
    _wait_default_sa(c)
    _record_identity(c)
    return ""


def _core_prepare(c: Ctx) -> Ctx:
    _check_ports_consistent(c)
    ensure_pki(c.pki)
    write_kubeconfig(c)
    _prepare_webhook_certs(c)
    return c


CORE = Unit("core", COMPONENTS, prepare=_core_prepare, after=_core_after, optional=False)


def up(autoscaler: str = "none", kueue: bool = False, extras: Sequence[str] = ()) -> Ctx:
    """Boot the control plane (idempotent). ``autoscaler="cluster-autoscaler"`` also runs the real
    cluster-autoscaler profile (:mod:`.ca_profile`), ``"karpenter"`` Karpenter's kwok provider (a comma list runs
    both); ``"none"`` starts none and leaves one that an earlier ``up`` started running (other sessions share this
    cluster; ``down --only-autoscaler`` stops it). ``extras`` names optional components (:mod:`.extras`: kueue,
    trainer, gcs...) to run; ``kueue=True`` adds ``"kueue"``. A running extra not named is left alone. Every unit
    runs through :func:`kfp_gpu_rehearsal.devcluster.runner.up`, in the order of :data:`kfp_gpu_rehearsal.devcluster.table.UNITS`.

    Raises: BootError (also for an unknown ``autoscaler`` or extra), CertError.
    """
    from . import extras as registry

    try:
        ca, more = registry.parse_autoscaler(autoscaler)
        chosen = registry.select([*extras, *more, *(["kueue"] if kueue else [])])
    except registry.UnknownExtra as e:
        raise BootError(str(e)) from None
    c = _ctx()
    _check_binaries(c)
    with runner.locked(c.state):
        return _up(c, {CORE.name, *(["cluster-autoscaler"] if ca else []), *(e.name for e in chosen)})


def _up(c: Ctx, wanted: set[str]) -> Ctx:
    from .table import UNITS

    t0 = time.monotonic()
    status: dict[str, str] = {}
    for unit in UNITS:
        runner.up(c, unit, unit.name in wanted, status, t0)
    (c.state / "state.json").write_text(json.dumps(
        {"ports": c.ports, "kubeconfig": str(c.kubeconfig), "versions": c.versions.__dict__,
         "started": status, "up_seconds": round(time.monotonic() - t0, 2)}, indent=2))
    print(f"[up] cluster ready in {time.monotonic() - t0:.1f}s; KUBECONFIG={c.kubeconfig}", flush=True)
    return c


def down(purge: bool = False, only_autoscaler: bool = False, only_kueue: bool = False,
         only: Sequence[str] = ()) -> None:
    """Stop what ``up`` started, in the reverse order of the table (an extra whose webhooks guard others' objects
    goes while the API server still runs). ``only`` names optional units of the table (:mod:`.table`: an extra of
    :mod:`.extras`, or ``cluster-autoscaler``) to stop and nothing else; ``only_kueue`` is ``only=("kueue",)``;
    ``only_autoscaler`` stops cluster-autoscaler and Karpenter only.

    Raises: BootError naming the choices for an unknown unit.
    """
    from .table import UNITS

    names = (*only, *(["kueue"] if only_kueue else []),
             *(["cluster-autoscaler", "karpenter"] if only_autoscaler else []))
    optional = [u.name for u in UNITS if u.optional]
    unknown = [n for n in names if n not in optional]
    if unknown:
        raise BootError(f"unknown local-cluster component {unknown[0]!r}: choose from {', '.join(optional)}")
    c = _ctx()
    with runner.locked(c.state):
        _down(c, purge, names)


def _down(c: Ctx, purge: bool, only: tuple[str, ...] = ()) -> None:
    from .table import UNITS

    for unit in reversed(UNITS):  # on exit CA deletes its nodes via the API server, which stops last
        if only and unit.name not in only:
            continue
        if runner.stop(c, unit):
            print(f"[down] stopped {unit.name}", flush=True)
    if purge and not only:
        shutil.rmtree(c.state / "etcd", ignore_errors=True)
        (c.state / "state.json").unlink(missing_ok=True)
        print("[down] purged etcd data", flush=True)


def status() -> dict[str, str]:
    """One line per process of every unit that runs, one per optional unit that does not. Read-only."""
    from .table import UNITS

    c = _ctx()
    out: dict[str, str] = {}
    for unit in UNITS:
        out.update(runner.status(c, unit))
    return out


def fingerprints() -> dict[str, tuple[str, str | None]]:
    """Per running process: (the fingerprint ``up`` would start it with now, the one it runs with). A difference
    means the next ``up`` restarts it. Read-only (nothing is started, written or installed)."""
    from .table import UNITS

    c = _ctx()
    out: dict[str, tuple[str, str | None]] = {}
    for unit in UNITS:
        cx = unit.context(c)
        for comp in unit.processes:
            if runner.pid(cx, comp) is not None:
                out[comp.name] = (runner.component_fingerprint(cx, comp), runner.recorded_fingerprint(cx, comp))
    return out


def main_up(autoscaler: str = "none", kueue: bool = False, extras: Sequence[str] = ()) -> int:
    try:
        up(autoscaler, kueue, extras)
    except (BootError, CertError) as e:
        print(f"[up] FAILED: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


def main_down(purge: bool = False, only_autoscaler: bool = False, only_kueue: bool = False,
              only: Sequence[str] = ()) -> int:
    try:
        down(purge, only_autoscaler, only_kueue, only)
    except BootError as e:
        print(f"[down] FAILED: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


def main_status(show_fingerprints: bool = False) -> int:
    st = status()
    prints = fingerprints() if show_fingerprints else {}
    for k, v in st.items():
        fp = prints.get(k)
        note = "" if fp is None else ("; up re-uses it" if fp[0] == fp[1] else "; up RESTARTS it (flags changed)")
        print(f"{k:26s} {v}{note}")
    print(f"kubeconfig: {kubeconfig_path()}")
    return 0 if all(("healthy" in v or v.startswith("stopped (profile")) and "UNHEALTHY" not in v
                    for v in st.values()) else 1
