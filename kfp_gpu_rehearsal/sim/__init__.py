"""kfp_gpu_rehearsal.sim: a local GKE / Compute / Cloud Quotas stand-in whose node pools become KWOK Nodes.

Start one from Python::

    from kfp_gpu_rehearsal.sim import SimServer
    sim = SimServer("scenario.yaml", kubeconfig="~/.cache/kfp-gpu/cluster/kubeconfig")
    url = sim.start()   # give url as api_endpoint to the google-cloud-* REST clients
    ...
    sim.stop()

or as ``python -m kfp_gpu_rehearsal.sim --scenario FILE --port P --kubeconfig K``. See docs/sim.md.

Scenario durations are real-world seconds; the stand-in runs them :func:`scale` times faster
(``compress(real_world_s)``), and so must every consumer that reasons about its timing.
"""

from kfp_gpu_rehearsal.sim.clock import compress, scale
from kfp_gpu_rehearsal.sim.scenario import Scenario, from_dict, load
from kfp_gpu_rehearsal.sim.server import SimServer

__all__ = ["Scenario", "SimServer", "compress", "from_dict", "load", "scale"]
