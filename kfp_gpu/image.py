"""The component image: its tag is tied to the package version, as GCPC does; users may point it elsewhere.

``VERSION`` is the installed distribution's version (``importlib.metadata.version("kfp-gpu")``),
falling back to ``[project].version`` of the source checkout's pyproject.toml when the package is not
installed (e.g. run from a plain checkout). tests/test_image_version.py keeps the two, the
Dockerfile's ``KFP_GPU_VERSION`` and every ``components/*/component.yaml`` image in step.

Users who mirror the image to their own registry set ``KFP_GPU_IMAGE=REPO:TAG`` (read when
``kfp_gpu.components`` is imported, i.e. when the components are defined) or pass
``kfp-gpu compile --image REPO:TAG``, which also rewrites the compiled YAML (:func:`retag_compiled`).
See docs/images.md.
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path
from typing import Any

from kfp_gpu.errors import InvalidSpec

IMAGE_REPO = "ghcr.io/kfp-gpu/kfp-gpu"
DIST_NAME = "kfp-gpu"
ENV_VAR = "KFP_GPU_IMAGE"
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
STEP_ENTRY = "kfp_gpu.steps.entry"  # every kfp-gpu component body imports it; no user component does

# An OCI reference that names a tag or a digest (or both): [host[:port]/]path[:tag][@algo:hex].
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
# a registry host is told apart from a path component as Docker does: it has a dot or a port, or is localhost
_HOST = rf"(?:(?:localhost|{_LABEL}(?:\.{_LABEL})+)(?::[0-9]+)?/|{_LABEL}:[0-9]+/)?"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
_REF = re.compile(rf"^{_HOST}{_PATH}(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}))?"
                  r"(?:@(?P<digest>[a-z0-9]+(?:[+._-][a-z0-9]+)*:[a-fA-F0-9]{32,}))?$")


def pyproject_version(path: Path = PYPROJECT) -> str | None:
    """``[project].version`` from pyproject.toml, or None when the file is absent or has none."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    section = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    if not section:
        return None
    m = re.search(r'^version\s*=\s*"([^"]+)"', section.group(1), re.M)
    return m.group(1) if m else None


def package_version() -> str:
    """The kfp-gpu version: installed metadata, else pyproject.toml, else ``0.0.0+unknown``."""
    try:
        return metadata.version(DIST_NAME)
    except metadata.PackageNotFoundError:
        return pyproject_version() or "0.0.0+unknown"


VERSION = package_version()


def validate_image(value: str, source: str = "--image") -> str:
    """``value`` if it is an image reference with a tag or digest (``REPO:TAG``, ``REPO@sha256:...``).

    Raises:
        InvalidSpec: naming ``source`` (``--image`` or ``KFP_GPU_IMAGE``), the value and the fix.
    """
    m = _REF.match(value.strip()) if value else None
    if m is None or not (m.group("tag") or m.group("digest")):
        raise InvalidSpec(
            source, value, "must be an image reference with a tag, REPO:TAG (or REPO@sha256:DIGEST)",
            remediation=f"set {source} to e.g. us-docker.pkg.dev/PROJECT/REPO/kfp-gpu:{VERSION} "
            "(see docs/images.md)",
        )
    return value.strip()


def image_for_version(version: str | None = None) -> str:
    """The image every component's ``base_image`` points to.

    With ``version``: ``ghcr.io/kfp-gpu/kfp-gpu:<version>``. Without: ``$KFP_GPU_IMAGE`` when set, else
    the published image of the installed version.

    Raises:
        InvalidSpec: ``$KFP_GPU_IMAGE`` is set but is not ``REPO:TAG``.
    """
    if version is None and os.environ.get(ENV_VAR, "").strip():
        return validate_image(os.environ[ENV_VAR], ENV_VAR)
    return f"{IMAGE_REPO}:{version or VERSION}"


def _is_kfp_gpu_executor(container: dict[str, Any]) -> bool:
    body = " ".join(str(x) for x in [*(container.get("command") or []), *(container.get("args") or [])])
    return STEP_ENTRY in body


def retag_compiled(path: str | Path, image: str) -> list[str]:
    """Point every kfp-gpu executor of the compiled pipeline ``path`` at ``image``; user components keep
    theirs. Rewrites the file only when something changed. Returns the executors that now use ``image``.

    Raises:
        InvalidSpec: ``image`` is not ``REPO:TAG``.
        OSError: the file cannot be read or written.
    """
    import yaml

    image = validate_image(image)
    p = Path(path)
    docs = [d for d in yaml.safe_load_all(p.read_text(encoding="utf-8")) if d is not None]
    ours, changed = [], False
    for doc in docs:
        for name, ex in sorted(((doc.get("deploymentSpec") or {}).get("executors") or {}).items()):
            container = ex.get("container") or {}
            if container and _is_kfp_gpu_executor(container):
                ours.append(name)
                if container.get("image") != image:
                    container["image"], changed = image, True
    if changed:
        p.write_text(yaml.dump_all(docs, sort_keys=True), encoding="utf-8")  # as kfp's compiler writes it
    return ours
