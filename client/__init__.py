"""slotserve's Python client library: InferenceClient (KServe v2 inference service and gRPC health),
ManagementClient (slotserve's ModelManagement service) and ClientError, the one exception both raise.

    from client import InferenceClient
    with InferenceClient("127.0.0.1:8001", timeout=10) as server:
        outputs = server.infer("add", {"INPUT0": a, "INPUT1": b})

`python -m client --help` is the ops command line built on them.
"""

from .errors import ClientError
from .inference import InferenceClient, ModelMetadata, RepositoryModel, ServerMetadata, TensorMetadata
from .management import ManagementClient, ModelStatus

__all__ = [
    "ClientError",
    "InferenceClient",
    "ManagementClient",
    "ModelMetadata",
    "ModelStatus",
    "RepositoryModel",
    "ServerMetadata",
    "TensorMetadata",
]
