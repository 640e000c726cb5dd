"""How a load's failure reaches the requests that needed the model (lazy loading's initializer and its waiters, a
batch's leader and its members)."""

from __future__ import annotations

from engine.errors import EngineError

from .errors import BackendNotAvailable, ModelLoadFailed, ServiceError, UnsupportedSlotCount


def as_request_error(name: str, error: BaseException) -> BaseException:
    """How a load failure reaches a request that needed the model: engine problems and unsupported slot
    counts and backends this server does not run become ModelLoadFailed; residency and memory refusals keep
    their own reason."""
    if isinstance(error, (EngineError, UnsupportedSlotCount, BackendNotAvailable)):
        return ModelLoadFailed(name, error)
    if isinstance(error, ServiceError):
        return error
    return error


__all__ = ["as_request_error"]
