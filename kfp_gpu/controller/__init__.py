"""The kfp-gpu controller: the privileged half, once per cluster, acting on GpuGang objects (kfp-gpu.io).

- :mod:`.handlers`: the kopf handlers (a daemon per gang, the finalizer) and ``kfp-gpu controller``;
- :mod:`.runner`: one gang's loop, doing what :func:`kfp_gpu.plan.gang.next_action` says;
- :mod:`.work`: the child process that runs one step function under the controller's identity;
- :mod:`.owners`: is the pipeline that owns a gang still there?
- :mod:`.metrics`: the Prometheus endpoint;
- :mod:`.flags`: `kfp-gpu controller`'s flags and command;
- :mod:`.election`: the Lease that elects the one acting replica.
"""
