"""GKE capacity provider (google-cloud-compute / -container / -quotas, imported lazily).

    from kfp_gpu.providers.gke import GkeProvider
    p = GkeProvider("my-project", "us-central1", "my-cluster")                    # real GCP, ADC
    p = GkeProvider("local-project", "us-central1", "kfp-gpu-local",
                    endpoint="http://127.0.0.1:8787")                             # kfp_gpu_rehearsal.sim stand-in
"""

from kfp_gpu.providers.gke.classify import ERROR_SCOPES, HTTP_SCOPES
from kfp_gpu.providers.gke.provider import GkeProvider

__all__ = ["ERROR_SCOPES", "HTTP_SCOPES", "GkeProvider"]
