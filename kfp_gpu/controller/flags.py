"""``kfp-gpu controller``'s flags and command: the namespaces it serves, leader election (a Lease, client-go's
flag names and controller-runtime's defaults: :mod:`kfp_gpu.plan.election`), metrics and logs. Imports nothing
heavy until the command runs, so the CLI's other commands do not pay for kopf."""

from __future__ import annotations

import argparse

from kfp_gpu import job_fields
from kfp_gpu.errors import KfpGpuError


def add_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("--namespace", "-n", action="append", default=[],
                   help="only gangs in this namespace (repeatable; default: every namespace)")
    c.add_argument("--all-namespaces", "-A", action="store_true", help="every namespace (the default)")
    c.add_argument("--standalone", action="store_true",
                   help="no leader election: the only replica, acting at once (local rehearsal)")
    c.add_argument("--leader-elect-resource-name", default="kfp-gpu-controller", metavar="NAME",
                   help="the Lease that elects the one acting replica")
    c.add_argument("--leader-elect-resource-namespace", default="", metavar="NS",
                   help="the Lease's namespace (default: $POD_NAMESPACE, else kfp-gpu-system)")
    c.add_argument("--leader-elect-lease-duration", type=int, default=15, metavar="S",
                   help="seconds a standby waits, after the Lease last changed, before taking it over (15)")
    c.add_argument("--leader-elect-renew-deadline", type=float, default=10.0, metavar="S",
                   help="seconds the leader tries to renew before it stops all work and exits (10)")
    c.add_argument("--leader-elect-retry-period", type=float, default=2.0, metavar="S",
                   help="seconds between two renewals, or two tries of a standby (2)")
    c.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port (0: off)")
    c.add_argument("--log-dir", default="", help="where each unit of work logs (default /tmp/kfp-gpu-controller)")
    c.set_defaults(fn=command)


def command(a: argparse.Namespace) -> int:
    """Run the controller until it is stopped; impossible election timings fail in one line naming the flag."""
    from kfp_gpu.controller.handlers import run as run_controller
    from kfp_gpu.plan.election import Timings

    timings = Timings(a.leader_elect_lease_duration, a.leader_elect_renew_deadline, a.leader_elect_retry_period)
    if timings.problem():
        raise KfpGpuError(timings.problem())
    for ns in a.namespace:
        job_fields.namespace("--namespace", ns)
    if a.leader_elect_resource_namespace:
        job_fields.namespace("--leader-elect-resource-namespace", a.leader_elect_resource_namespace)
    from kfp_gpu.cluster.karpenter import template_extras

    template_extras()  # a bad $KFP_GPU_KARPENTER_TEMPLATE stops the controller here, in one line, not a gang later
    run_controller([] if a.all_namespaces else list(a.namespace), standalone=a.standalone,
                   lease=a.leader_elect_resource_name, lease_namespace=a.leader_elect_resource_namespace,
                   timings=timings, metrics_port=a.metrics_port, log_dir=a.log_dir)
    return 0
