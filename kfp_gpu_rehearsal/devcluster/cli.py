"""Command line for the local control plane."""

from __future__ import annotations

import argparse
import sys

from . import extras


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kfp_gpu_rehearsal.devcluster", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the binaries into the cache (skips present ones)")
    b.add_argument("--with-autoscaler", action="store_true", help="also build cluster-autoscaler (-tags kwok)")
    b.add_argument("--with-kueue", action="store_true", help="also build the Kueue controller (sigs.k8s.io/kueue)")
    b.add_argument("--with", dest="extras", action="append", default=[], metavar="NAME",
                   help=f"also build an optional component: one of {', '.join(extras.names())} (repeatable)")
    u = sub.add_parser("up", help="boot the cluster (idempotent)")
    u.add_argument("--autoscaler", default="none",
                   help="cluster-autoscaler: also run the real cluster-autoscaler (kwok provider, GPU node groups, "
                   "ProvisioningRequests; build it with `build --with-autoscaler`); karpenter: Karpenter's kwok "
                   "provider (build it with `build --with karpenter`); a comma list runs both; none (default)")
    u.add_argument("--kueue", action="store_true", help="also run the real Kueue controller with its CRDs and "
                   "webhooks (build it with `build --with-kueue`); without it a running Kueue is left alone")
    u.add_argument("--with", dest="extras", action="append", default=[], metavar="NAME",
                   help=f"also run an optional component: one of {', '.join(extras.names())} (repeatable)")
    u.add_argument("--trainer", dest="extras", action="append_const", const="trainer",
                   help="same as --with trainer: JobSet + Kubeflow Trainer v2 and the torch-distributed runtime")
    u.add_argument("--gcs", dest="extras", action="append_const", const="gcs",
                   help="same as --with gcs: the fake-gcs-server emulator for gs:// checkpoints")
    d = sub.add_parser("down", help="stop the processes started by 'up' (by pid file)")
    d.add_argument("--purge", action="store_true", help="also delete the etcd data (cluster state)")
    d.add_argument("--only-autoscaler", action="store_true", help="stop only the cluster-autoscaler profile")
    d.add_argument("--only-kueue", action="store_true", help="stop only the Kueue profile (and remove its webhooks)")
    d.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="stop only this optional component (repeatable)")
    st = sub.add_parser("status", help="print component status")
    st.add_argument("--fingerprints", action="store_true",
                    help="also say, per running process, whether the next `up` would re-use it (same flags, config "
                    "files and env) or restart it (read-only)")
    n = sub.add_parser("nodes", help="create N KWOK GPU nodes in a pool and time until all are Ready")
    n.add_argument("count", type=int)
    n.add_argument("--pool", default="scale")
    n.add_argument("--boot-delay", type=float, default=0.0, help="seconds until each node turns Ready")
    n.add_argument("--delete", action="store_true", help="delete the pool's nodes afterwards")
    args = p.parse_args(argv)
    if args.cmd == "build":
        from .build import main as build_main

        return build_main(with_autoscaler=args.with_autoscaler, with_kueue=args.with_kueue, extras=args.extras)
    if args.cmd == "nodes":
        from .scale import create_and_wait, delete_pool

        res = create_and_wait(args.count, pool=args.pool, boot_delay_s=args.boot_delay)
        print(f"{res.count} nodes: created in {res.create_seconds}s, all Ready after {res.ready_seconds}s")
        if args.delete:
            print(f"deleted {delete_pool(args.pool)} nodes")
        return 0
    from . import boot

    if args.cmd == "up":
        return boot.main_up(args.autoscaler, args.kueue, args.extras)
    if args.cmd == "down":
        return boot.main_down(purge=args.purge, only_autoscaler=args.only_autoscaler, only_kueue=args.only_kueue,
                              only=args.only)
    return boot.main_status(show_fingerprints=args.fingerprints)


if __name__ == "__main__":
    sys.exit(main())
