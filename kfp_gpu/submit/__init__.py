"""Submit a compiled pipeline to a KFP API server or to Vertex AI Pipelines, and reach a GKE cluster
from a Vertex-launched component. SDKs (kfp client, google.cloud) are imported lazily inside the
functions, never at ``import kfp_gpu.submit`` time."""

from kfp_gpu.submit.result import SubmitResult, load_package

__all__ = ["SubmitResult", "load_package"]
