"""Building an upstream Go module's binary through a wrapper module: what the cluster-autoscaler and Kueue builds share.

The wrapper (``<cache>/build/<module>-<version>/go.mod``) requires the upstream module at the pinned version and
copies its requires and module replaces (replace directives are honoured only in the main module; local-path
replaces are dropped). Commands run with ``GOTOOLCHAIN=local``, ``-mod=mod -buildvcs=false`` and ``CGO_ENABLED=0``,
logged to a file; a failure raises the caller's error type with the last lines of output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


def go_env(nosum: Sequence[str] = ()) -> dict[str, str]:
    """The build environment; ``nosum`` module paths are left out of the checksum database (the proxy serves a
    pinned pseudo-version the sum database does not list; go.sum still pins it locally)."""
    env = dict(os.environ)
    env.setdefault("GOTOOLCHAIN", "local")
    env["GOFLAGS"] = (env.get("GOFLAGS", "") + " -mod=mod -buildvcs=false").strip()
    env["CGO_ENABLED"] = "0"
    if nosum:
        have = [p for p in env.get("GONOSUMDB", "").split(",") if p]
        env["GONOSUMDB"] = ",".join([*have, *nosum])
    return env


def run(cmd: Sequence[str], cwd: Path, log: Path, error: type[Exception], nosum: Sequence[str] = ()) -> str:
    """Run one go command, appending its output to ``log``; returns stdout.

    Raises: ``error`` with the command, its exit code and the last 25 lines of output.
    """
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}  (in {cwd})\n")
        fh.flush()
        proc = subprocess.run(list(cmd), cwd=cwd, env=go_env(nosum), capture_output=True, text=True)
        fh.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise error(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{tail}\n(full log: {log})")
    return proc.stdout


def other_go_builds() -> list[int]:
    """Pids of running ``go build`` commands (the machine is small: builds wait for each other)."""
    out: list[int] = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) >= 2 and argv[0].endswith(b"go") and argv[1] == b"build":
            out.append(int(d.name))
    return out


def wrapper_gomod(upstream: Mapping[str, Any], module: str, ver: str, name: str, *, go: str = "1.24.0",
                  local_src: str = "") -> str:
    """The wrapper module's go.mod from ``go mod edit -json`` of the upstream go.mod.

    ``local_src`` replaces the module itself with a (patched) local copy.
    """
    lines = [f"module kfpgpu.local/build/{name}", "", f"go {go}", "", "require (", f"\t{module} {ver}"]
    for r in upstream.get("Require") or []:
        if r["Path"] != module:
            lines.append(f"\t{r['Path']} {r['Version']}")
    lines.append(")")
    reps: list[str] = []
    for r in upstream.get("Replace") or []:
        old, new = r["Old"], r["New"]
        if new.get("Version"):  # module replace: copy; local-path replaces are dropped
            old_s = old["Path"] + (" " + old["Version"] if old.get("Version") else "")
            reps.append(f"\t{old_s} => {new['Path']} {new['Version']}")
    if local_src:
        reps.append(f"\t{module} => {local_src}")
    if reps:
        lines += ["", "replace (", *reps, ")"]
    return "\n".join(lines) + "\n"


def go_build(tag: str, package: str, out: Path, work: Path, log: Path, error: type[Exception], *,
             flags: Sequence[str] = ("-ldflags", "-s -w"), what: str = "", wait_for_others: bool = False,
             poll_s: float = 10.0, setup_s: float | None = None, nosum: Sequence[str] = ()) -> Path:
    """``go build -trimpath <flags> -o <out> <package>`` in the wrapper module ``work``, the binary written under a
    temporary name and renamed into place (a crashed build never leaves a half-written binary in the cache). With
    ``wait_for_others`` it first waits while other ``go build`` commands run (the machine is small). Prints one
    line before and one after, tagged ``[tag]``; ``what`` (default ``package``) names what is built.

    Raises: ``error`` (see :func:`run`).
    """
    while wait_for_others and other_go_builds():
        print(f"[{tag}] waiting for other go builds {other_go_builds()}", flush=True)
        time.sleep(poll_s)
    from . import buildtimes

    t1 = time.monotonic()
    print(f"[{tag}] building {what or package}{buildtimes.note(out.name)} (log {log})", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    run(["go", "build", "-trimpath", *flags, "-o", str(tmp), package], work, log, error, nosum)
    tmp.rename(out)
    took = time.monotonic() - t1
    buildtimes.record(out.name, took + (setup_s or 0.0))
    setup = f" (setup {setup_s:.0f}s)" if setup_s is not None else ""
    print(f"[{tag}] built in {took:.0f}s{setup} -> {out}", flush=True)
    return out


def cli_main(module: str, tag: str, build: Callable[[], Path], error: type[Exception],
             argv: Sequence[str] | None = None) -> int:
    """``python -m kfp_gpu_rehearsal.devcluster.<module> build``: build into the cache, print the binary's path; 2 on bad
    usage, 1 (one line) when the build fails."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["build"] or len(args) > 1:
        print(f"usage: python -m kfp_gpu_rehearsal.devcluster.{module} build", file=sys.stderr)
        return 2
    try:
        print(build())
    except error as exc:
        print(f"[{tag}] build FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0
