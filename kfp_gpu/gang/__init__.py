"""The namespaced API between pipeline steps and the kfp-gpu controller (API group ``kfp-gpu.io``).

:mod:`kfp_gpu.gang.api` is the contract (kinds, stages, conditions, the body of a GpuGang); the thin client the
steps use is :mod:`kfp_gpu.gang.client`; the controller that acts on gangs is :mod:`kfp_gpu.controller`.
"""
