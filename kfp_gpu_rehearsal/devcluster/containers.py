"""`kfp-gpu run --containers`: every kfp-gpu step of the rehearsal runs in the component image (podman, runc).

kfp.local resolves each task's placeholders (the executor input, output paths) exactly as the KFP launcher does and
hands the resolved ``command + args`` of the compiled ``PipelineContainerSpec`` to a task handler. The handler of
``SubprocessRunner`` is looked up by attribute at every task (``subprocess_task_handler.SubprocessTaskHandler``);
:func:`step_runner` puts :class:`StepHandler` there for the length of the run. A kfp-gpu step (its command runs
``kfp_gpu.steps.entry``) then starts as ``podman run IMAGE <command> <args>`` with the compiled image and that exact
argv (kfp.local's SubprocessRunner would instead swap ``python3`` for the host's interpreter); every other task (a
user component on a public base image, which cannot be pulled here) goes to kfp.local's own handler, on the host,
as without ``--containers``.

The container: host network (the local API server and the stand-ins listen on 127.0.0.1), the pipeline root
read-write at the same path, the step's kubeconfig and its CA file read-only, the environment the rehearsal gives
its steps (KUBECONFIG, ``KFP_GPU_*``, the stand-ins' endpoints) and uid 0, so the outputs it writes into the
bind-mounted pipeline root belong to the caller (with rootless podman, uid 0 in the container is the calling user).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kfp_gpu.image import STEP_ENTRY

MARK = "kfp-gpu-image:"  # one line per task on kfp.local's stdout: where it ran (kfp_gpu_rehearsal.demo.Progress shows it)
ENV_PREFIXES = ("KFP_GPU_", "AWS_ENDPOINT_URL")
ENV_NAMES = ("KUBECONFIG", "STORAGE_EMULATOR_HOST", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
             "AWS_DEFAULT_REGION", "AWS_REGION")
_names = itertools.count()


def is_kfp_gpu_step(command: Sequence[str]) -> bool:
    """True for a kfp-gpu component's resolved argv (its body imports :data:`kfp_gpu.image.STEP_ENTRY`). Pure."""
    return any(STEP_ENTRY in part for part in command)


def step_env(environ: Mapping[str, str], task_env: Mapping[str, str]) -> dict[str, str]:
    """The environment a containerised step gets: the rehearsal's own variables for its steps, then the task's
    (the compiled ``env``). Pure."""
    keep = {k: v for k, v in environ.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}
    return {**keep, **task_env}


def kubeconfig_files(path: Path) -> list[str]:
    """The files a kubeconfig names (CA, client certificate and key, token file), for read-only mounts."""
    doc = yaml.safe_load(path.read_text()) or {}
    files: list[str] = []
    for c in doc.get("clusters") or []:
        files += [str(c.get("cluster", {}).get("certificate-authority") or "")]
    for u in doc.get("users") or []:
        files += [str(u.get("user", {}).get(k) or "") for k in ("client-certificate", "client-key", "tokenFile")]
    return [f for f in files if f]


def run_argv(image: str, command: Sequence[str], env: Mapping[str, str], ro: Sequence[str],
             rw: Sequence[str], name: str) -> list[str]:
    """``podman run`` for one step: ``command`` after the image, untouched. Pure."""
    argv = ["podman", "run", "--rm", "--name", name, "--network", "host", "--user", "0:0"]
    for path in dict.fromkeys(rw):
        argv += ["--volume", f"{path}:{path}:rw"]
    for path in dict.fromkeys(ro):
        argv += ["--volume", f"{path}:{path}:ro"]
    for key, value in sorted(env.items()):
        argv += ["--env", f"{key}={value}"]
    return [*argv, image, *command]


@dataclass
class Config:
    """What every containerised step shares: extra mounts, podman's environment, the images seen per task."""

    podman_env: Mapping[str, str]
    expected_image: str = ""  # a kfp-gpu step compiled with another image fails (it cannot be pulled here)
    rw: list[str] = field(default_factory=list)
    ro: list[str] = field(default_factory=list)
    host_handler: Any = None  # kfp.local's own SubprocessTaskHandler (set by step_runner)
    ran: list[tuple[str, str]] = field(default_factory=list)  # (image, "podman" | "host")

    def mount_checkpoint(self, uri: str) -> None:
        """A local checkpoint directory (no scheme) is mounted read-write: the train step's launcher reads it."""
        if "://" not in uri:
            Path(uri).mkdir(parents=True, exist_ok=True)
            self.rw.append(uri)


class StepHandler:
    """A kfp.local task handler (the signature of kfp.local's handlers) that runs kfp-gpu steps in containers."""

    def __init__(self, image: str, full_command: list[str], pipeline_root: str, runner: Any,
                 env_vars: dict[str, str] | None = None, *, config: Config) -> None:
        self.image, self.command, self.root, self.runner = image, list(full_command), pipeline_root, runner
        self.env_vars, self.config = dict(env_vars or {}), config

    def run(self) -> Any:
        from kfp.local import status

        if not is_kfp_gpu_step(self.command):
            self.config.ran.append((self.image, "host"))
            print(f"{MARK} host subprocess ({self.image} is not built here)", flush=True)
            return self.config.host_handler(self.image, self.command, self.root, self.runner, self.env_vars).run()
        if self.config.expected_image and self.image != self.config.expected_image:
            print(f"kfp-gpu: step image {self.image} is not the local {self.config.expected_image} (fix: compile "
                  f"with KFP_GPU_IMAGE={self.config.expected_image}, as `kfp-gpu run --containers` does)", flush=True)
            return status.Status.FAILURE
        env = step_env(os.environ, self.env_vars)
        ro = list(self.config.ro)
        if kc := env.get("KUBECONFIG"):
            ro += [kc, *kubeconfig_files(Path(kc))]
        argv = run_argv(self.image, self.command, env, ro, [self.root, *self.config.rw],
                        f"kfp-gpu-step-{os.getpid()}-{next(_names)}")
        self.config.ran.append((self.image, "podman"))
        print(f"{MARK} {self.image} (podman, runc, host network)", flush=True)
        with subprocess.Popen(argv, env=dict(self.config.podman_env), stdout=subprocess.PIPE,  # noqa: S603
                              stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                print(line, end="")
            code = proc.wait()
        return status.Status.SUCCESS if code == 0 else status.Status.FAILURE


@contextlib.contextmanager
def step_runner(config: Config) -> Iterator[Config]:
    """kfp.local's SubprocessRunner tasks go through :class:`StepHandler` inside this block (restored after)."""
    from kfp.local import subprocess_task_handler as sth

    original = sth.SubprocessTaskHandler
    config.host_handler = original
    handler: Callable[..., StepHandler] = lambda *a, **kw: StepHandler(*a, **kw, config=config)  # noqa: E731
    sth.SubprocessTaskHandler = handler
    try:
        yield config
    finally:
        sth.SubprocessTaskHandler = original


def prepare(cache: Path | None = None) -> Config:
    """Before the pipeline file is loaded: check that the component image is built and make the kfp-gpu components
    compile with it (``KFP_GPU_IMAGE``).

    Raises: InvalidSpec naming ``--containers`` when podman or the image is missing (fix: ``make images``).
    """
    from kfp_gpu import image
    from kfp_gpu.errors import InvalidSpec
    from kfp_gpu_rehearsal.devcluster import images

    cache = cache or images.cache_dir()
    if missing := images.missing_tools():
        raise InvalidSpec("--containers", ", ".join(missing), "not installed", remediation="run `make images`")
    env = images.podman_env(cache)
    if not images.exists(images.COMPONENT, env):
        raise InvalidSpec("--containers", images.COMPONENT, "is not built", remediation="run `make images`")
    os.environ[image.ENV_VAR] = images.COMPONENT
    return Config(podman_env=env, expected_image=images.COMPONENT)
