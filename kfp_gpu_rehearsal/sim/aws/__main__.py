"""python -m kfp_gpu_rehearsal.sim.aws --port P --kubeconfig K [--scenario FILE] [--url-file F]"""

from __future__ import annotations

import sys

from kfp_gpu_rehearsal.sim import serve


def main(argv: list[str] | None = None) -> int:
    from kfp_gpu_rehearsal.sim.aws.server import AwsSimServer

    return serve.main(argv, prog="kfp_gpu_rehearsal.sim.aws", description="EKS/ASG/EC2/Service Quotas stand-in",
                      port=8788, scenario_help="scenario YAML (default: the built-in two-AZ p4d scenario)",
                      kubeconfig_help="cluster whose Nodes the instances become; omit: in memory",
                      make=lambda sc, kc, host, port: AwsSimServer(sc, kc, host=host, port=port),
                      banner=lambda url: f"kfp-gpu AWS stand-in serving {url}")


if __name__ == "__main__":
    sys.exit(main())
