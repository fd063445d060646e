"""Build the real GCS emulator (``github.com/fsouza/fake-gcs-server``) the local cluster serves gs:// from.

Build: the module at ``FAKE_GCS_SERVER_VERSION`` (versions.env) is built in a wrapper module under
``<cache>/build/github.com_fsouza_fake-gcs-server-<version>`` that requires it (its go.mod requires are copied, it
has no replaces; upstream's go.sum is copied). The binary (the module's root ``main`` package) lands in
``<cache>/bin/fake-gcs-server-<version>`` (CGO_ENABLED=0, ``-trimpath -ldflags "-s -w"``). No source change.

Run: :func:`kfp_gpu_rehearsal.devcluster.gcs_profile.up` starts it with the dev cluster (``up --gcs``); the
``google-cloud-storage`` client talks to it when ``STORAGE_EMULATOR_HOST`` names its URL
(:func:`kfp_gpu.checkpoint.backends.emulator_host`).

    python -m kfp_gpu_rehearsal.devcluster.gcs build      # build into the cache (skips when present)
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from . import gobuild
from .versions import binary_path, cache_dir, load_versions

MODULE = "github.com/fsouza/fake-gcs-server"
NAME = "fake-gcs-server"
VERSION_KEY = "FAKE_GCS_SERVER_VERSION"


class GcsEmulatorError(RuntimeError):
    """Building or running the GCS emulator failed (never skipped silently)."""


def version() -> str:
    """The pinned version. Raises: GcsEmulatorError when versions.env has no FAKE_GCS_SERVER_VERSION."""
    v = load_versions().get(VERSION_KEY, "").strip()
    if not v:
        raise GcsEmulatorError(f"{VERSION_KEY} is empty in kfp_gpu_rehearsal/devcluster/versions.env; set it (e.g. v1.56.1)")
    return v


def binary() -> Path:
    """Where the pinned binary is cached. Raises: GcsEmulatorError (no pin)."""
    return binary_path(NAME, version())


def require_binary() -> Path:
    """The cached binary. Raises: GcsEmulatorError naming the build command when it is missing."""
    b = binary()
    if not b.exists():
        raise GcsEmulatorError(f"{b} is missing; build it: .venv/bin/python -m kfp_gpu_rehearsal.devcluster.gcs build "
                               "(or make build GCS=1)")
    return b


def _run(cmd: Sequence[str], cwd: Path, log: Path) -> str:
    return gobuild.run(cmd, cwd, log, GcsEmulatorError)


def build(*, wait_for_others: bool = True, poll_s: float = 10.0) -> Path:
    """Build fake-gcs-server into the cache; a present binary is reused.

    Raises: GcsEmulatorError (missing toolchain, download or compile failure).
    """
    ver = version()
    out = binary_path(NAME, ver)
    if out.exists():
        return out
    if shutil.which("go") is None:
        raise GcsEmulatorError("the Go toolchain ('go') is not on PATH; install Go >= 1.26 to build fake-gcs-server")
    work = cache_dir() / "build" / f"{MODULE.replace('/', '_')}-{ver}"
    work.mkdir(parents=True, exist_ok=True)
    log = cache_dir() / "build" / f"{NAME}-{ver}.log"
    t0 = time.monotonic()
    _run(["go", "mod", "download", f"{MODULE}@{ver}"], work, log)
    modcache = Path(_run(["go", "env", "GOMODCACHE"], work, log).strip())
    src = modcache / f"{MODULE}@{ver}"
    upstream = json.loads(_run(["go", "mod", "edit", "-json", str(src / "go.mod")], work, log))
    (work / "go.mod").write_text(gobuild.wrapper_gomod(upstream, MODULE, ver, NAME,
                                                       go=str(upstream.get("Go") or "1.26")))
    if not (work / "go.sum").exists():
        shutil.copyfile(src / "go.sum", work / "go.sum")
        (work / "go.sum").chmod(0o644)
    return gobuild.go_build("gcs", MODULE, out, work, log, GcsEmulatorError, what=f"{MODULE}@{ver}",
                            wait_for_others=wait_for_others, poll_s=poll_s, setup_s=time.monotonic() - t0)


def main(argv: Sequence[str] | None = None) -> int:
    return gobuild.cli_main("gcs", "gcs", build, GcsEmulatorError, argv)


if __name__ == "__main__":
    sys.exit(main())
