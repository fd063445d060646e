"""python -m kfp_gpu_rehearsal.sim --scenario FILE --port P --kubeconfig K"""

from __future__ import annotations

import sys

from kfp_gpu_rehearsal.sim import serve


def main(argv: list[str] | None = None) -> int:
    from kfp_gpu_rehearsal.devcluster.worldtime import TIME_SCALE
    from kfp_gpu_rehearsal.sim.server import SimServer

    return serve.main(argv, prog="kfp_gpu_rehearsal.sim", description="GKE/Compute/Cloud Quotas stand-in", port=8787,
                      scenario_help="scenario YAML (default: the bundled default.yaml)",
                      kubeconfig_help="cluster whose Nodes setSize drives; omit to keep nodes in memory",
                      make=lambda sc, kc, host, port: SimServer(sc, kc, host=host, port=port),
                      banner=lambda url: f"kfp-gpu sim serving {url} (scenario time runs {TIME_SCALE:g}x faster "
                                         "than real)")


if __name__ == "__main__":
    sys.exit(main())
