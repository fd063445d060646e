"""`make images`: build the component and trainer images here, with podman + runc and no registry.

Three images, each built at most once per content hash (``<cache>/images/built.json`` records tag -> content hash
and the image id it produced; a warm run inspects three image ids and returns). The hash is not an image label:
``podman build --label`` changes every layer's cache key, so a code change would re-install torch.

* ``localhost/kfp-gpu-base:bookworm-py311``: Debian 12 from Debian's packages (mmdebstrap, minbase), python3.11 in a
  venv at /opt/python first on PATH (the layout of ``python:3.11-slim``: ``python``, ``python3``, ``pip``), imported
  with ``podman import``. Stands in for ``python:3.11-slim``, which cannot be pulled here.
* ``localhost/kfp-gpu:VERSION``: the repository's ``Dockerfile`` with ``--build-arg BASE=<the local base>``.
* ``localhost/kfp-gpu-trainer:VERSION``: ``pipelines/trainer/Dockerfile``, same base.

The Dockerfiles are the ones users build with Docker (their ``BASE`` defaults to ``python:3.11-slim``). podman runs
with runc and cgroupfs (crun refuses this kernel's hybrid cgroup v1 layout) and explicit nofile/nproc ulimits
(runc cannot raise the defaults podman asks for here): :func:`podman_env` writes that ``containers.conf``. The
host's pip configuration and CA bundle are mounted into the build (never copied into a layer), so pip inside the
build trusts what the host's pip trusts (a TLS-inspecting egress proxy, here).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp_gpu.errors import KfpGpuError
from kfp_gpu.image import VERSION

REPO = Path(__file__).resolve().parents[2]
BASE = "localhost/kfp-gpu-base:bookworm-py311"
COMPONENT = f"localhost/kfp-gpu:{VERSION}"
TRAINER = f"localhost/kfp-gpu-trainer:{VERSION}"
ULIMITS = ("nofile=20000:20000", "nproc=4096:4096")
CONTAINERS_CONF = f"""# written by kfp_gpu_rehearsal.devcluster.images: podman on this kernel (hybrid cgroup v1) needs runc + cgroupfs
[containers]
default_ulimits = [{", ".join(f'"{u}"' for u in ULIMITS)}]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
"""
DEBIAN = ("deb http://deb.debian.org/debian bookworm main",
          "deb http://deb.debian.org/debian bookworm-updates main",
          "deb http://deb.debian.org/debian-security bookworm-security main")
BASE_PACKAGES = ("python3", "python3-venv", "passwd", "ca-certificates")
BASE_HOOKS = ('chroot "$1" python3 -m venv /opt/python',
              'rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*')
BASE_CHANGES = ("ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "ENV LANG=C.UTF-8", 'CMD ["python3"]')
HOST_TRUST = ("/etc/pip.conf", "/etc/ssl/certs/ca-certificates.crt")
# Measured on the 2-core dev machine (docs/images.md); shown before a build with no earlier measurement.
DEFAULT_ESTIMATE_S = {BASE: 40.0, COMPONENT: 60.0, TRAINER: 240.0}


@dataclass(frozen=True)
class Image:
    """One image: its tag, Dockerfile (None: the mmdebstrap base) and the repository files that go into it."""

    tag: str
    dockerfile: str | None
    inputs: tuple[str, ...]


def component_inputs(repo: Path = REPO) -> tuple[str, ...]:
    """The repository files the component image's ``COPY`` lines take, relative to ``repo``."""
    code = sorted(str(p.relative_to(repo)) for p in (repo / "kfp_gpu").rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)
    return ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md", "constraints.txt", *code)


def trainer_inputs(repo: Path = REPO) -> tuple[str, ...]:
    """The repository files the trainer image's ``COPY`` lines take."""
    ckpt = sorted(str(p.relative_to(repo)) for p in (repo / "kfp_gpu" / "checkpoint").rglob("*.py"))
    return ("pipelines/trainer/Dockerfile", ".dockerignore", "kfp_gpu/__init__.py", "kfp_gpu/errors.py", "kfp_gpu/py.typed", *ckpt,
            "pipelines/__init__.py", "pipelines/trainer/__init__.py", "pipelines/trainer/train_lm.py")


def images(repo: Path = REPO) -> tuple[Image, Image, Image]:
    return (Image(BASE, None, ()), Image(COMPONENT, "Dockerfile", component_inputs(repo)),
            Image(TRAINER, "pipelines/trainer/Dockerfile", trainer_inputs(repo)))


def content_hash(image: Image, base_hash: str, repo: Path = REPO) -> str:
    """sha256 over the base's hash, the tag and every input file's path and bytes (the base: its recipe). Pure
    but for reading the files; raises OSError for a missing input."""
    h = hashlib.sha256(f"{image.tag}\n{base_hash}\n".encode())
    if image.dockerfile is None:
        h.update(json.dumps([DEBIAN, BASE_PACKAGES, BASE_HOOKS, BASE_CHANGES]).encode())
    for rel in image.inputs:
        h.update(f"{rel}\n".encode())
        h.update((repo / rel).read_bytes())
    return h.hexdigest()[:16]


def podman_env(cache: Path) -> dict[str, str]:
    """The environment for every podman call of the rehearsal: ``CONTAINERS_CONF`` pointing at a containers.conf
    under ``cache`` (written if missing or different)."""
    conf = cache / "containers" / "containers.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
        conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def build_argv(image: Image, host_trust: Iterable[str] = HOST_TRUST) -> list[str]:
    """``podman build`` for a Dockerfile image (host network, the local base, host pip trust mounted read-only).
    Pure."""
    assert image.dockerfile is not None
    argv = ["podman", "build", "--network", "host", *(f"--ulimit={u}" for u in ULIMITS),
            "--build-arg", f"BASE={BASE}", "--build-arg", f"KFP_GPU_VERSION={VERSION}",
            "-t", image.tag, "-f", image.dockerfile]
    for path in host_trust:
        argv += ["--volume", f"{path}:{path}:ro"]
    return [*argv, "."]


def base_script(tar: Path) -> str:
    """The shell pipeline that makes the base: mmdebstrap to a tarball, then ``podman import``. Pure."""
    include = ",".join(BASE_PACKAGES)
    hooks = " ".join(f"--customize-hook='{h}'" for h in BASE_HOOKS)
    sources = " ".join(f'"{s}"' for s in DEBIAN)
    changes = " ".join(f"--change '{c}'" for c in BASE_CHANGES)
    return (f"mmdebstrap --variant=minbase --include={include} {hooks} bookworm {tar} {sources} && "
            f"podman import {changes} {tar} {BASE} && rm -f {tar}")


def image_id(tag: str, env: Mapping[str, str]) -> str:
    """The id of local image ``tag``, "" when it is absent."""
    out = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", tag], env=env, capture_output=True,
                         text=True, check=False)
    return out.stdout.strip() if out.returncode == 0 else ""


def built_hash(record: Mapping[str, Mapping[str, str]], tag: str, current_id: str) -> str:
    """The content hash ``tag`` was built from, if the image is still the one that build produced; else "". Pure."""
    entry = record.get(tag) or {}
    return str(entry.get("hash", "")) if current_id and entry.get("id") == current_id else ""


def exists(tag: str, env: Mapping[str, str]) -> bool:
    return subprocess.run(["podman", "image", "exists", tag], env=env, check=False).returncode == 0


def size_mb(tag: str, env: Mapping[str, str]) -> float:
    out = subprocess.run(["podman", "image", "inspect", "--format", "{{.Size}}", tag], env=env,
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip()) / 1e6


def missing_tools() -> list[str]:
    return [t for t in ("podman", "runc", "buildah", "mmdebstrap") if shutil.which(t) is None]


def cache_dir() -> Path:
    return Path(os.environ.get("KFP_GPU_CACHE", Path.home() / ".cache" / "kfp-gpu"))


def _load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text())) if path.exists() else {}


def ensure(repo: Path = REPO, cache: Path | None = None,
           say: Callable[[str], None] = print) -> dict[str, dict[str, object]]:
    """Build what is missing or stale, base first, then the component and trainer images in parallel. Returns
    per image: ``built`` (bool), ``seconds``, ``size_mb``, ``hash``. Build logs: ``<cache>/images/*.log``.

    Raises: KfpGpuError naming the missing tool or the failed image and its log (with the fix).
    """
    cache = cache or cache_dir()
    show = say
    if missing := missing_tools():
        raise KfpGpuError(f"cannot build the images: {', '.join(missing)} not installed "
                          "(fix: apt-get install -y podman runc buildah mmdebstrap, or run `make images`)")
    env = podman_env(cache)
    logs = cache / "images"
    logs.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = _load(logs / "timings.json")
    record: dict[str, dict[str, str]] = _load(logs / "built.json")
    base, *rest = images(repo)
    result: dict[str, dict[str, object]] = {}
    base_hash = content_hash(base, "", repo)
    jobs: list[tuple[Image, str, subprocess.Popen[bytes], float, str]] = []

    def start(image: Image, digest: str, argv: list[str], shell: bool = False) -> None:
        est = timings.get(image.tag, DEFAULT_ESTIMATE_S[image.tag])
        show(f"images: building {image.tag} (estimated {est:.0f} s; log {logs / _slug(image.tag)}.log)")
        with open(logs / f"{_slug(image.tag)}.log", "wb") as f:
            proc = subprocess.Popen(argv if not shell else ["bash", "-o", "pipefail", "-c", argv[0]],  # noqa: S603
                                    cwd=repo, env=env, stdout=f, stderr=subprocess.STDOUT)
        jobs.append((image, digest, proc, time.monotonic(), image_id(image.tag, env)))

    def finish() -> None:
        for image, digest, proc, t0, old in jobs:
            code = proc.wait()
            took = time.monotonic() - t0
            if code != 0:
                raise KfpGpuError(f"building {image.tag} failed (exit {code}; log {logs / _slug(image.tag)}.log) "
                                  "(fix: read the log's last lines; rerun `make images`)")
            timings[image.tag] = round(took, 1)
            record[image.tag] = {"hash": digest, "id": image_id(image.tag, env)}
            if old and old != record[image.tag]["id"]:  # the image the tag left: its layers podman still uses stay
                subprocess.run(["podman", "rmi", old], env=env, capture_output=True, check=False)
            (logs / "built.json").write_text(json.dumps(record, indent=1))
            result[image.tag] = {"built": True, "seconds": round(took, 1), "hash": digest}
            show(f"images: built {image.tag} in {took:.1f} s")
        jobs.clear()

    if built_hash(record, BASE, image_id(BASE, env)) != base_hash:
        start(base, base_hash, [base_script(logs / "base.tar")], shell=True)
        finish()
    else:
        result[BASE] = {"built": False, "seconds": 0.0, "hash": base_hash}
    for image in rest:
        digest = content_hash(image, base_hash, repo)
        if built_hash(record, image.tag, image_id(image.tag, env)) == digest:
            result[image.tag] = {"built": False, "seconds": 0.0, "hash": digest}
        else:
            start(image, digest, build_argv(image, [p for p in HOST_TRUST if Path(p).exists()]))
    finish()
    (logs / "timings.json").write_text(json.dumps(timings, indent=1))
    for tag, info in result.items():
        info["size_mb"] = round(size_mb(tag, env), 1)
        show(f"images: {tag} {'built' if info['built'] else 'up to date'} ({info['size_mb']} MB, "
             f"hash {info['hash']})")
    return result


def _slug(tag: str) -> str:
    return tag.rsplit("/", 1)[-1].replace(":", "-")


def main(argv: Sequence[str] | None = None) -> int:
    t0 = time.monotonic()
    try:
        ensure()
    except KfpGpuError as err:
        print(f"kfp-gpu: {err}", file=sys.stderr)
        return 1
    print(f"images: done in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
