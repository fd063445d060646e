"""python -m kfp_gpu_rehearsal.sim.aws --port P --kubeconfig K [--scenario FILE] [--url-file F]"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from kfp_gpu.errors import KfpGpuError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kfp_gpu_rehearsal.sim.aws", description="EKS/ASG/EC2/Service Quotas stand-in")
    p.add_argument("--scenario", default=None, help="scenario YAML (default: the built-in two-AZ p4d scenario)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8788, help="0 picks a free port")
    p.add_argument("--kubeconfig", default=None, help="cluster whose Nodes the instances become; omit: in memory")
    p.add_argument("--url-file", default=None, help="write the base URL here once serving")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from kfp_gpu_rehearsal.sim.aws.server import AwsSimServer

    try:
        sim = AwsSimServer(args.scenario, os.path.expanduser(args.kubeconfig) if args.kubeconfig else None,
                           host=args.host, port=args.port)
        url = sim.start()
    except KfpGpuError as exc:
        print(f"kfp_gpu_rehearsal.sim.aws: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"kfp_gpu_rehearsal.sim.aws: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    if args.url_file:
        with open(args.url_file, "w") as fh:
            fh.write(url + "\n")
    print(f"kfp-gpu AWS stand-in serving {url}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
