"""config.pbtxt's `instance_group[0].rate_limiter`, read into a RateLimiterSpec (docs/lifecycle.md, "Rate limiter").

A model's slots (Triton's instances) may name resources they need to run: `resources [ { name, count, global } ]`
and a `priority` that weighs the model against the others waiting for the same resources. The server's pool of
resources (service/core/rate_limiter.py) applies them when the server runs with `--rate-limit execution_count`;
with `--rate-limit off` (the default, as tritonserver's) they are read and ignored.

Only the first instance group configures slotserve's slots (its count is the slot count), so only its
rate_limiter is read; a later group's is ignored with a warning (engine/config/fields.py).

`read_rate_limiter` checks the block and raises ModelConfigError naming the field; nothing here runs a model.
"""

from __future__ import annotations

from dataclasses import dataclass

from generated import model_config_pb2

from ..errors import ModelConfigError


@dataclass(frozen=True)
class ResourceNeed:
    """One resource a slot needs to run: `count` copies of `name`, per device or (`shared`) one pool server-wide
    (config.pbtxt's `global`, a Python keyword)."""

    name: str
    count: int
    shared: bool = False


@dataclass(frozen=True)
class RateLimiterSpec:
    """What each slot of a model needs to run, and its weight among the waiters (0 counts as 1, as Triton's)."""

    resources: tuple[ResourceNeed, ...] = ()
    priority: int = 0


def read_rate_limiter(config: model_config_pb2.ModelConfig, origin: str) -> RateLimiterSpec | None:
    """The first instance group's rate_limiter (None: not set). Raises ModelConfigError on a resource without a
    name, or named twice in the group."""
    if not config.instance_group or not config.instance_group[0].HasField("rate_limiter"):
        return None
    block = config.instance_group[0].rate_limiter
    needs: list[ResourceNeed] = []
    for index, resource in enumerate(block.resources):
        where = f"{origin}: instance_group[0].rate_limiter.resources[{index}]"
        if not resource.name:
            raise ModelConfigError(f"{where}: a resource needs a name")
        if any(need.name == resource.name for need in needs):
            raise ModelConfigError(f"{where}: resource '{resource.name}' is listed twice")
        needs.append(ResourceNeed(resource.name, int(resource.count), bool(getattr(resource, "global"))))
    return RateLimiterSpec(tuple(needs), int(block.priority))


__all__ = ["RateLimiterSpec", "ResourceNeed", "read_rate_limiter"]
