"""The kfp-gpu controller as a row of the dev cluster's table: ``up --with controller`` runs it, ``status`` shows
it, ``down --only controller`` stops it, and a later ``up`` re-uses it while its fingerprint (argv, identity
environment, the code it runs) is unchanged.

It is the controller ``kfp-gpu run`` and ``make demo`` use (:func:`serve`), and the same process
:class:`kfp_gpu_rehearsal.devcluster.controller.LocalController` runs for the integration tier (one definition of its
argv and identity: :meth:`LocalController.argv` and :meth:`LocalController.identity_env`): ``kfp-gpu controller
--standalone --namespace NS...`` under the controller's ServiceAccount token (a TokenRequest kubeconfig in
``<state>/controller/``) and the stand-ins' controller credentials; the steps of the namespaces it serves run as
their ``kfp-gpu`` ServiceAccount. A run's GKE stand-in is found by the run's ``target.cluster``
(:func:`kfp_gpu.providers.local_endpoint`), so one process serves several runs, each in its own world.

Which namespaces (:func:`served`): ``$KFP_GPU_CONTROLLER_NAMESPACES`` (comma list), default ``kfp-gpu-dev``, which
``up`` makes tenants (``kfp-gpu tenant add``, default limits); plus each namespace a ``kfp-gpu run`` asked for
(:func:`serve`, recorded in ``<state>/controller/run-namespaces``; the run made it a tenant with its own limits),
kept while it exists and is a tenant. Never every namespace: the integration tier runs controllers of its own for
its own namespaces on the same API server, and two controllers acting on one namespace would both work its gangs.
A namespace added changes the argv, so the runner restarts the process (a few seconds; the gangs it was working are
level-triggered state in the API and the new process picks them up).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from . import procs, runner
from .controller import LocalController, sa_kubeconfig
from .ports import CONTROLLER
from .runner import Component, Ctx

NAME = "kfp-gpu-controller"  # process name: kfp-gpu-controller.{pid,args,log,json} in the state dir
UNIT_NAME = "controller"
PORT_KEY = "controller-metrics"
NAMESPACES_ENV = "KFP_GPU_CONTROLLER_NAMESPACES"
DEFAULT_NAMESPACE = "kfp-gpu-dev"
CODE_ENV = "KFP_GPU_CONTROLLER_CODE"  # the fingerprint of the code it runs: a changed tree restarts it on up


def namespaces() -> list[str]:
    return [n.strip() for n in os.environ.get(NAMESPACES_ENV, DEFAULT_NAMESPACE).split(",") if n.strip()]


def _code_root() -> Path:
    import kfp_gpu

    return Path(kfp_gpu.__file__).resolve().parent


def code_digest() -> str:
    """sha256 over the controller's code (every kfp_gpu/**/*.py, by path and content)."""
    h = hashlib.sha256()
    root = _code_root()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _runs_file(c: Ctx) -> Path:
    return c.unit_dir(UNIT_NAME) / "run-namespaces"


def _run_namespaces(c: Ctx) -> list[str]:
    try:
        return [n for n in _runs_file(c).read_text().split() if n]
    except OSError:
        return []


def served(c: Ctx) -> list[str]:
    """The namespaces the row runs for: :func:`namespaces`, then the runs' (sorted), each once."""
    own = namespaces()
    return own + sorted(set(_run_namespaces(c)) - set(own))


def kubeconfig(c: Ctx) -> Path:
    return c.unit_dir(UNIT_NAME) / "kubeconfig-controller"


def _local(c: Ctx) -> LocalController:
    return LocalController(kubeconfig(c), served(c), c.unit_dir(UNIT_NAME) / "controller.log", env={},
                           metrics_port=c.ports[PORT_KEY])


def _argv(c: Ctx) -> list[str]:
    return _local(c).argv()


def _env(c: Ctx) -> dict[str, str]:
    """The worktree's own code (the process starts in the state dir) and its digest, so an edit restarts it; the
    world's clock; and no stand-in URL of whoever started it: each gang's world is found by its target.cluster."""
    from kfp_gpu import rehearsal_seam

    from .worldtime import TIME_SCALE

    return {**_local(c).identity_env(), "PYTHONPATH": str(_code_root().parent), CODE_ENV: code_digest(),
            rehearsal_seam.SIM_ENDPOINT_ENV: "", rehearsal_seam.TIME_SCALE_ENV: f"{TIME_SCALE:g}"}


def _healthy(c: Ctx) -> bool:
    return procs.http_ok(f"http://127.0.0.1:{c.ports[PORT_KEY]}/metrics")


def _record(c: Ctx) -> str:
    (c.state / f"{NAME}.json").write_text(json.dumps({"namespaces": served(c)}) + "\n")
    return f" for namespace(s) {', '.join(served(c))} as {kubeconfig_identity()}"


def kubeconfig_identity() -> str:
    from kfp_gpu.gang import api as gang

    return f"ServiceAccount {gang.CONTROLLER_NAMESPACE}/{gang.CONTROLLER_SA}"


COMPONENT = Component(NAME, (PORT_KEY,), _argv, _healthy, timeout=90.0, env=_env, stop_timeout=40.0,
                      detail=lambda c: f"namespaces={','.join(_served(c.state))}", after=_record)


def context(c: Ctx) -> Ctx:
    """``c`` with the controller's 'binary' (this interpreter) and metrics port."""
    return runner.extend(c, {NAME: Path(sys.executable)}, CONTROLLER)


def prepare(c: Ctx) -> Ctx:
    """:func:`context`, after installing kfp-gpu without its Deployment (CRDs, RBAC, admission), making each
    namespace a tenant and minting the controller's token into :func:`kubeconfig`.

    Raises: procs.BootError naming the namespace and the fix when the API server refuses."""
    from kfp_gpu import install
    from kfp_gpu.errors import KfpGpuError
    from kfp_gpu.gang import api as gang

    from . import crds

    cx = context(c)
    admin = crds.api_client(cx.kubeconfig)
    try:
        install.apply(admin, controller=False, autoscaler_status=True)
        for ns in namespaces():
            install.tenant_add(admin, ns)
        sa_kubeconfig(admin, gang.CONTROLLER_NAMESPACE, gang.CONTROLLER_SA, kubeconfig(cx))
    except KfpGpuError as e:
        raise procs.BootError(f"controller: {e} (namespaces from {NAMESPACES_ENV}={','.join(namespaces())})") from None
    finally:
        admin.close()
    return cx


def _served(state: Path) -> list[str]:
    try:
        return list(json.loads((state / f"{NAME}.json").read_text())["namespaces"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def serving(c: Ctx, namespace: str) -> int | None:
    """The pid of the row's controller when it runs and serves ``namespace``, else None."""
    pid = runner.pids(c, UNIT).get(NAME)
    return pid if pid is not None and namespace in _served(c.state) else None


def serve(c: Ctx, namespace: str) -> tuple[int, str]:
    """For ``kfp-gpu run``: the row's controller, serving ``namespace`` (already a tenant) besides what it serves,
    started through the runner when it does not run (or runs other code, or not for ``namespace``: restarted).
    Returns its pid and the runner's word ("running": re-used, "started"). Namespaces an earlier run added that are
    gone, or no longer tenants, are dropped. Serialized with every up/down of the dev cluster.

    Raises: procs.BootError (not healthy: names its log; the API server refuses).
    """
    import time

    from kubernetes import client

    from kfp_gpu import ownership

    from . import crds

    with runner.locked(c.state):
        admin = crds.api_client(c.kubeconfig)
        try:
            tenants = {n.metadata.name for n in client.CoreV1Api(admin).list_namespace(
                label_selector=f"{ownership.TENANT_LABEL}=true").items}
        except client.ApiException as e:
            raise procs.BootError(f"controller: cannot list the tenant namespaces ({e.status} {e.reason})") from None
        finally:
            admin.close()
        if namespace not in tenants:
            raise procs.BootError(f"controller: namespace {namespace} is not a tenant: run kfp-gpu tenant add "
                                  f"{namespace}")
        runs = sorted((set(_run_namespaces(c)) & tenants) | {namespace})
        _runs_file(c).parent.mkdir(parents=True, exist_ok=True)
        _runs_file(c).write_text("".join(f"{n}\n" for n in runs))
        status: dict[str, str] = {}
        runner.up(c, UNIT, True, status, time.monotonic())
        return runner.pids(c, UNIT)[NAME], status[NAME]


def build(*, wait_for_others: bool = True) -> Path:
    """Nothing to build: the controller is this tree's Python package. Raises: ControllerBuildError when kopf (the
    controller's framework) is not installed in this interpreter."""
    del wait_for_others
    try:
        import kopf  # noqa: F401
    except ImportError:
        raise ControllerBuildError(f"kopf is not installed in {sys.executable}: run `make venv`") from None
    return Path(sys.executable)


class ControllerBuildError(RuntimeError):
    pass


UNIT = runner.Unit(UNIT_NAME, (COMPONENT,), off_hint="up --with controller starts it", context=context,
                   prepare=prepare)
