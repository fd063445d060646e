"""kfp_gpu_rehearsal/devcluster/podman_pod.py: the shipped controller Deployment rendered to `podman run` arguments
(no podman, no cluster); a field the stand-in cannot honour is refused in one line."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from kfp_gpu.errors import KfpGpuError
from kfp_gpu_rehearsal.devcluster import podman_pod

ROOT = Path(__file__).resolve().parents[2]
DEP = podman_pod.deployment(ROOT / "kfp_gpu/manifests/controller.yaml")


def _argv(dep: dict[str, object] = DEP, **kw: object) -> list[str]:
    return podman_pod.container_argv(dep, "localhost/kfp-gpu:1", name="c", pod_name="ctl-0", sa_dir=Path("/sa"),
                                     server="https://127.0.0.1:6443", **kw)  # type: ignore[arg-type]


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_the_shipped_deployment_runs_as_its_pod_would() -> None:
    argv = _argv()
    image_at = argv.index("localhost/kfp-gpu:1")
    assert argv[image_at + 1:] == ["controller", "--all-namespaces"]  # the manifest's args after its command
    assert _pairs(argv, "--entrypoint") == ["kfp-gpu"]
    assert _pairs(argv, "--user") == ["10001:10001"]
    assert {"--read-only", "--cap-drop=ALL"} <= set(argv) and _pairs(argv, "--security-opt") == ["no-new-privileges"]
    env = _pairs(argv, "--env")
    assert {"POD_NAME=ctl-0", "POD_NAMESPACE=kfp-gpu-system", "HOME=/tmp", "KUBERNETES_SERVICE_HOST=127.0.0.1",
            "KUBERNETES_SERVICE_PORT=6443"} <= set(env)
    assert _pairs(argv, "--volume") == [f"/sa:{podman_pod.SA_MOUNT}:ro"]
    assert _pairs(argv, "--tmpfs") == ["/tmp:rw,mode=1777"] and _pairs(argv, "--memory") == ["1g"]


def test_args_and_env_can_be_given_and_replace_or_add() -> None:
    argv = _argv(args=["controller", "-n", "team-a"], env={"X": "1"})
    assert argv[argv.index("localhost/kfp-gpu:1") + 1:] == ["controller", "-n", "team-a"]
    assert "X=1" in _pairs(argv, "--env")


@pytest.mark.parametrize(("path", "value", "named"), [
    (("containers", 0, "securityContext", "privileged"), True, "container securityContext.privileged"),
    (("containers", 0, "livenessProbe"), {"httpGet": {"port": 8080}}, "livenessProbe"),
    (("containers", 0, "env", 0), {"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
     "env X valueFrom"),
    (("volumes", 0), {"name": "tmp", "hostPath": {"path": "/"}}, "volumeMount tmp"),
    (("nodeSelector",), {"a": "b"}, "nodeSelector"),
])
def test_a_field_the_stand_in_cannot_honour_is_refused_naming_it(path: tuple[object, ...], value: object,
                                                                  named: str) -> None:
    dep = copy.deepcopy(DEP)
    node = dep["spec"]["template"]["spec"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(KfpGpuError) as err:
        _argv(dep)
    assert named in str(err.value) and "\n" not in err.value.message
