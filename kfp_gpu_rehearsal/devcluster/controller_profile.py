"""The kfp-gpu controller as a row of the dev cluster's table: ``up --with controller`` runs it, ``status`` shows
it, ``down --only controller`` stops it, and a later ``up`` re-uses it while its fingerprint (argv, identity
environment, the code it runs) is unchanged.

It is the same process :class:`kfp_gpu_rehearsal.devcluster.controller.LocalController` runs for ``kfp-gpu run`` and
the integration tier (one definition of its argv and identity: :meth:`LocalController.argv` and
:meth:`LocalController.identity_env`): ``kfp-gpu controller --standalone --namespace NS...`` under the controller's
ServiceAccount token (a TokenRequest kubeconfig in ``<state>/controller/``) and the stand-ins' controller
credentials; the steps of the namespaces it serves run as their ``kfp-gpu`` ServiceAccount.

Which namespaces: ``$KFP_GPU_CONTROLLER_NAMESPACES`` (comma list), default ``kfp-gpu-dev``; ``up`` makes each a
tenant (``kfp-gpu tenant add``, default limits). It never serves every namespace: ``kfp-gpu run`` and each test start
a controller of their own for their own namespace, and two controllers acting on one namespace would both work its
gangs; ``kfp-gpu run`` refuses a namespace this row serves (:func:`serving`).
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


def kubeconfig(c: Ctx) -> Path:
    return c.unit_dir(UNIT_NAME) / "kubeconfig-controller"


def _local(c: Ctx) -> LocalController:
    return LocalController(kubeconfig(c), namespaces(), c.unit_dir(UNIT_NAME) / "controller.log", env={},
                           metrics_port=c.ports[PORT_KEY])


def _argv(c: Ctx) -> list[str]:
    return _local(c).argv()


def _env(c: Ctx) -> dict[str, str]:
    # the worktree's own code (the process starts in the state dir), and its digest so an edit restarts it
    return {**_local(c).identity_env(), "PYTHONPATH": str(_code_root().parent), CODE_ENV: code_digest()}


def _healthy(c: Ctx) -> bool:
    return procs.http_ok(f"http://127.0.0.1:{c.ports[PORT_KEY]}/metrics")


def _record(c: Ctx) -> str:
    (c.state / f"{NAME}.json").write_text(json.dumps({"namespaces": namespaces()}) + "\n")
    return f" for namespace(s) {', '.join(namespaces())} as {kubeconfig_identity()}"


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


def refuse_served(c: Ctx, namespace: str) -> None:
    """For ``kfp-gpu run``, which starts a controller of its own for ``namespace``: two would both work its gangs.

    Raises: InvalidSpec naming target.namespace and the two ways out, when the row's controller serves it."""
    from kfp_gpu.errors import InvalidSpec

    pid = serving(c, namespace)
    if pid is not None:
        raise InvalidSpec("target.namespace", namespace, f"is served by the dev cluster's controller (pid {pid}, "
                          f"{NAMESPACES_ENV}); kfp-gpu run starts its own and two would both work its gangs",
                          remediation="run in another namespace, or stop that controller: python -m "
                          "kfp_gpu_rehearsal.devcluster down --only controller")


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
