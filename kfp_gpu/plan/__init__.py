"""Pure decision logic over observed state: no I/O, no sleeps, virtual time only.

* :mod:`kfp_gpu.plan.quota` - what a spec needs vs what quota rows say is free.
* :mod:`kfp_gpu.plan.placement` - rank region/zone placements.
* :mod:`kfp_gpu.plan.scale` - absolute per-pool target sizes for a gang, and the rollback plan.
* :mod:`kfp_gpu.plan.failover` - classified error -> blocked scope -> next zone.
* :mod:`kfp_gpu.plan.backoff` - exponential back-off with full jitter and a virtual clock.
"""
