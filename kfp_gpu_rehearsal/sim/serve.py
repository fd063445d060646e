"""The one command line of a stand-in process (``python -m kfp_gpu_rehearsal.sim`` and ``...sim.aws``): parse
``--scenario/--host/--port/--kubeconfig/--url-file/-v``, start the server, print one banner line, serve until
SIGTERM or SIGINT. A bad scenario or a busy port is one line on stderr and a non-zero exit, no traceback."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Protocol

from kfp_gpu.errors import KfpGpuError


class Server(Protocol):
    def start(self) -> str: ...

    def stop(self) -> None: ...


def main(argv: list[str] | None, *, prog: str, description: str, port: int, scenario_help: str,
         kubeconfig_help: str, make: Callable[[str | None, str | None, str, int], Server],
         banner: Callable[[str], str]) -> int:
    """Serve the stand-in ``make(scenario, kubeconfig, host, port)`` builds. Returns the exit code."""
    p = argparse.ArgumentParser(prog=f"python -m {prog}", description=description)
    p.add_argument("--scenario", default=None, help=scenario_help)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=port, help="0 picks a free port")
    p.add_argument("--kubeconfig", default=None, help=kubeconfig_help)
    p.add_argument("--url-file", default=None, help="write the base URL here once serving")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kubeconfig = os.path.expanduser(args.kubeconfig) if args.kubeconfig else None
    if kubeconfig and not os.path.isfile(kubeconfig):
        print(f"{prog}: --kubeconfig {kubeconfig!r}: no such file; give an existing kubeconfig or omit it",
              file=sys.stderr)
        return 2
    try:
        sim = make(args.scenario, kubeconfig, args.host, args.port)
        url = sim.start()
    except KfpGpuError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.exit_code
    except FileNotFoundError as exc:
        print(f"{prog}: --scenario {args.scenario!r}: {exc.strerror} ({exc.filename}); give an existing file, a "
              "bundled scenario name, or omit --scenario", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{prog}: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    if args.url_file:
        with open(args.url_file, "w") as fh:
            fh.write(url + "\n")
    print(banner(url), flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    sim.stop()
    return 0
