"""python -m kfp_gpu_rehearsal.sim --scenario FILE --port P --kubeconfig K"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from kfp_gpu.errors import KfpGpuError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kfp_gpu_rehearsal.sim", description="GKE/Compute/Cloud Quotas stand-in")
    p.add_argument("--scenario", default=None, help="scenario YAML (default: the bundled default.yaml)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8787, help="0 picks a free port")
    p.add_argument("--kubeconfig", default=None,
                   help="cluster whose Nodes setSize drives; omit to keep nodes in memory")
    p.add_argument("--url-file", default=None, help="write the base URL here once serving")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from kfp_gpu_rehearsal.sim.server import SimServer

    kubeconfig = os.path.expanduser(args.kubeconfig) if args.kubeconfig else None
    try:
        sim = SimServer(args.scenario, kubeconfig, host=args.host, port=args.port)
        url = sim.start()
    except KfpGpuError as exc:
        print(f"kfp_gpu_rehearsal.sim: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"kfp_gpu_rehearsal.sim: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    if args.url_file:
        with open(args.url_file, "w") as fh:
            fh.write(url + "\n")
    from kfp_gpu_rehearsal.sim.clock import TIME_SCALE

    print(f"kfp-gpu sim serving {url} (scenario time runs {TIME_SCALE:g}x faster than real)", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
