"""kfp_gpu.sim: a local GKE / Compute / Cloud Quotas stand-in whose node pools become KWOK Nodes.

Start one from Python::

    from kfp_gpu.sim import SimServer
    sim = SimServer("scenario.yaml", kubeconfig="~/.cache/kfp-gpu/cluster/kubeconfig")
    url = sim.start()   # give url as api_endpoint to the google-cloud-* REST clients
    ...
    sim.stop()

or as ``python -m kfp_gpu.sim --scenario FILE --port P --kubeconfig K``. See docs/sim.md.
"""

from kfp_gpu.sim.scenario import Scenario, from_dict, load
from kfp_gpu.sim.server import SimServer

__all__ = ["Scenario", "SimServer", "from_dict", "load"]
