"""The rate limiter's pool (service/core/rate_limiter.py): availability, load-time errors, the order of waiters and
the hand-off, without threads (`arrive` never blocks); the blocking `acquire` with a fake clock and tokens."""

from __future__ import annotations

import threading

import pytest

from engine.config.rate_limiter import RateLimiterSpec, ResourceNeed
from engine.errors import ModelLoadError
from engine.interface import CancelToken
from service.core.errors import RequestCancelled
from service.core.rate_limiter import (
    RateLimitMode,
    ResourceFlag,
    ResourcePool,
    ResourcesBusy,
    WaiterState,
    parse_resource_flag,
)


def needs(*resources: tuple[str, int] | tuple[str, int, bool], priority: int = 0) -> RateLimiterSpec:
    return RateLimiterSpec(tuple(ResourceNeed(*resource) for resource in resources), priority)


def test_the_default_availability_is_the_most_any_model_needs() -> None:
    pool = ResourcePool()
    pool.register("a/1", needs(("R1", 4), ("R2", 4)))
    pool.register("b/1", needs(("R2", 5), ("R3", 10)))
    pool.register("c/1", needs(("R1", 1), ("R3", 7)))
    assert pool.available() == {"R1": 4, "R2": 5, "R3": 10}  # docs/user_guide/rate_limiter.md's example
    pool.unregister("b/1")
    assert pool.available() == {"R1": 4, "R2": 4, "R3": 7}


def test_a_flag_sets_the_availability_and_a_model_needing_more_fails_to_load_with_tritons_words() -> None:
    pool = ResourcePool([ResourceFlag("resource1", 3)])
    with pytest.raises(ModelLoadError) as refused:
        pool.register("m/1", needs(("resource1", 4)))
    assert str(refused.value) == (
        'Resource count for "resource1" is limited to 3 which will prevent scheduling of one or more model '
        "instances, the minimum required count is 4"
    )
    assert pool.available() == {}  # nothing registered
    pool.register("m/1", needs(("resource1", 3)))
    assert pool.available() == {"resource1": 3}


def test_the_most_any_applicable_flag_gives_is_the_count() -> None:
    pool = ResourcePool(
        [ResourceFlag("R", 5, 0), ResourceFlag("R", 8), ResourceFlag("R", 9, 1), ResourceFlag("G", 3, 1)]
    )
    pool.register("m/1", needs(("R", 1), ("G", 1, True)))
    assert pool.available() == {"G": 3, "R": 8}  # device 0: max(5 for it, 8 for all); global: any device's


def test_a_flag_for_another_device_leaves_none_on_the_slots_device() -> None:
    pool = ResourcePool([ResourceFlag("resource1", 10, device=10)])
    with pytest.raises(ModelLoadError, match="is limited to 0 which"):
        pool.register("m/1", needs(("resource1", 4)))
    # A device flag is ignored for a global resource.
    ResourcePool([ResourceFlag("g", 2, device=10)]).register("m/1", needs(("g", 2, True)))


def test_once_a_flag_is_given_a_resource_it_does_not_give_has_none() -> None:
    pool = ResourcePool([ResourceFlag("Q", 1)])
    with pytest.raises(ModelLoadError, match='"R" is limited to 0 which'):
        pool.register("dev/1", needs(("R", 4)))
    with pytest.raises(ModelLoadError, match='"G" is limited to 0 which'):
        pool.register("glob/1", needs(("G", 2, True)))
    with pytest.raises(ModelLoadError, match='"R" is limited to 0 which'):
        ResourcePool([ResourceFlag("r", 5)]).register("dev/1", needs(("R", 4)))  # names match as written
    assert pool.available() == {}


def test_a_resource_global_in_one_model_and_per_device_in_another_is_a_load_error() -> None:
    pool = ResourcePool()
    pool.register("a/1", needs(("resource2", 2, True)))
    with pytest.raises(ModelLoadError) as refused:
        pool.register("b/1", needs(("resource2", 2, False)))
    assert str(refused.value) == (
        'Resource "resource2" is present as both global and device-specific resource in the model configuration.'
    )
    pool.register("a/1", needs(("resource2", 2, False)))  # a model re-registering its own needs is no conflict


def test_parse_resource_flag() -> None:
    assert parse_resource_flag("R1:10") == ResourceFlag("R1", 10)
    assert parse_resource_flag("R2:5:1") == ResourceFlag("R2", 5, 1)
    for bad in ("R1", "R1:x", ":3", "R1:1:2:3", "R1:-1", "R1:1:-2"):
        with pytest.raises(ValueError, match=f"'{bad}'"):
            parse_resource_flag(bad)


def test_two_models_sharing_a_resource_of_one_run_one_at_a_time_and_the_release_hands_it_over() -> None:
    pool = ResourcePool()
    pool.register("a/1", needs(("R", 1)))
    pool.register("b/1", needs(("R", 1)))
    first = pool.arrive("a/1")
    second = pool.arrive("b/1")
    assert (first.state, second.state) == (WaiterState.GRANTED, WaiterState.QUEUED)
    assert second.waker is not None and second.waker.locked()
    first.release()
    assert second.state is WaiterState.GRANTED  # handed over under the lock: nobody can take it in between
    assert not second.waker.locked()
    first.release()  # idempotent: gives nothing back twice
    third = pool.arrive("a/1")
    assert third.state is WaiterState.QUEUED
    second.release()
    assert third.state is WaiterState.GRANTED


def test_no_barging_a_newcomer_waits_behind_a_waiter_even_when_its_own_resources_are_free() -> None:
    pool = ResourcePool([ResourceFlag("R1", 1), ResourceFlag("R2", 1)])
    pool.register("big/1", needs(("R1", 1), ("R2", 1)))
    pool.register("small/1", needs(("R2", 1)))
    holder = pool.arrive("small/1")
    blocked = pool.arrive("big/1")  # needs R2 too: waits
    newcomer = pool.arrive("small/1")  # ... and so does a newcomer, though R1 alone would not stop it
    assert (holder.state, blocked.state, newcomer.state) == (
        WaiterState.GRANTED,
        WaiterState.QUEUED,
        WaiterState.QUEUED,
    )
    holder.release()
    assert (blocked.state, newcomer.state) == (WaiterState.GRANTED, WaiterState.QUEUED)
    blocked.release()
    assert newcomer.state is WaiterState.GRANTED


def test_a_model_without_needs_or_unregistered_never_waits() -> None:
    pool = ResourcePool()
    pool.register("a/1", needs(("R", 1)))
    pool.register("free/1", needs(("R", 0)))
    held = pool.arrive("a/1")
    assert pool.arrive("free/1").state is WaiterState.GRANTED
    assert pool.arrive("unknown/1").state is WaiterState.GRANTED
    held.release()


def test_waiters_of_one_priority_take_turns_by_model_as_tritons_execution_count() -> None:
    pool = ResourcePool()
    pool.register("a/1", needs(("R", 1)))
    pool.register("b/1", needs(("R", 1)))
    running = pool.arrive("a/1")  # a has run once
    a_again = pool.arrive("a/1")  # weighed 1 x 1 run
    b_first = pool.arrive("b/1")  # weighed 1 x 0 runs: b's turn comes first although it came later
    running.release()
    assert (b_first.state, a_again.state) == (WaiterState.GRANTED, WaiterState.QUEUED)
    b_first.release()
    assert a_again.state is WaiterState.GRANTED


def test_one_model_alone_is_served_in_arrival_order() -> None:
    pool = ResourcePool()
    pool.register("a/1", needs(("R", 1)))
    held = pool.arrive("a/1")
    waiters = [pool.arrive("a/1") for _ in range(4)]
    order = []
    for _ in waiters:
        held.release()
        (held,) = [w for w in waiters if w.state is WaiterState.GRANTED and w not in order]
        order.append(held)
    assert order == waiters


def test_priority_two_gets_half_the_turns_of_priority_one() -> None:
    pool = ResourcePool()
    pool.register("one/1", needs(("R", 1), priority=1))
    pool.register("two/1", needs(("R", 1), priority=2))
    served: list[str] = []
    held = pool.arrive("one/1")
    served.append("one")
    for _ in range(6):  # one waiter of each model at every hand-off
        queued = [w for w in (pool.arrive("one/1"), pool.arrive("two/1")) if w.state is WaiterState.QUEUED]
        held.release()
        (held,) = [w for w in queued if w.state is WaiterState.GRANTED]
        served.append(held.model.split("/")[0])
        for waiter in queued:
            if waiter is not held:
                pool._withdraw(waiter, WaiterState.CANCELLED)  # leave, so each turn starts from the same queue
    # Weighed priority x runs at arrival (ties in arrival order): two's weight grows twice as fast.
    assert served == ["one", "two", "one", "one", "two", "one", "one"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_wait_ends_at_its_deadline_naming_the_resource_and_unblocks_those_behind() -> None:
    clock = FakeClock()
    pool = ResourcePool(clock=clock)
    pool.register("caller/1", needs(("GPU_MEM", 1)))
    pool.register("callee/1", needs(("GPU_MEM", 1)))
    held = pool.arrive("caller/1")
    with pytest.raises(ResourcesBusy) as busy:
        pool.acquire("callee/1", deadline=clock.now)  # already due: no wait at all
    assert "model 'callee'" in str(busy.value)
    assert "'GPU_MEM' (needs 1, 0 of 1 free)" in str(busy.value)
    assert busy.value.error_reason == "server_busy"
    assert pool.queued() == 0  # it left the queue
    held.release()
    assert pool.arrive("callee/1").state is WaiterState.GRANTED  # nothing of the expired wait remains


def test_a_cancelled_wait_leaves_the_queue_and_raises_cancelled() -> None:
    pool = ResourcePool()
    pool.register("a/1", needs(("R", 1)))
    held = pool.arrive("a/1")
    token = CancelToken()
    token.cancel("gone")  # fires at once when the wait registers its callback
    with pytest.raises(RequestCancelled):
        pool.acquire("a/1", deadline=None, cancel=token)
    assert pool.queued() == 0
    held.release()


def test_a_blocked_acquire_is_woken_by_the_release() -> None:
    pool = ResourcePool()
    pool.register("a/1", needs(("R", 1)))
    held = pool.arrive("a/1")
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire("a/1", deadline=None)))
    waiter.start()
    # ordering-free: poll until the waiter has queued (bounded)
    for _ in range(10_000):
        if pool.queued():
            break
        threading.Event().wait(0.001)
    assert pool.queued() == 1
    held.release()
    waiter.join(10)
    assert not waiter.is_alive() and len(got) == 1


def test_tritons_flags_reach_the_server_options() -> None:
    from service.process.cli import option_fields
    from service.process.flags import server_parser
    from service.process.options import ServerOptions

    args = server_parser().parse_args(
        ["--rate-limit=EXECUTION_COUNT", "--rate-limit-resource=R1:10", "--rate-limit-resource", "R2:5:0"]
    )
    fields = option_fields(args)
    assert fields["rate_limit"] is RateLimitMode.EXECUTION_COUNT
    assert fields["rate_limit_resources"] == (ResourceFlag("R1", 10), ResourceFlag("R2", 5, 0))
    plain = option_fields(server_parser().parse_args([]))
    assert "rate_limit" not in plain and ServerOptions.rate_limit is RateLimitMode.OFF  # off by default, as Triton


def test_the_first_instance_groups_rate_limiter_is_read_and_a_later_ones_ignored() -> None:
    from engine.config.fields import classify_fields
    from engine.config.rate_limiter import read_rate_limiter
    from engine.config.repository import parse_config_text

    config = parse_config_text(
        """name: "m"
        instance_group [
          { count: 1 rate_limiter { resources [ { name: "R1" count: 4 }, { name: "R2" global: true count: 2 } ]
                                    priority: 2 } },
          { count: 1 rate_limiter { resources [ { name: "R3" count: 1 } ] } } ]""",
        "m",
    )
    assert read_rate_limiter(config, "m") == RateLimiterSpec(
        (ResourceNeed("R1", 4), ResourceNeed("R2", 2, shared=True)), priority=2
    )
    judged = classify_fields(config)
    assert judged.refused == ()
    assert ("instance_group[1].rate_limiter", "only the first instance group's rate limiter applies to the slots") in (
        judged.ignored
    )


@pytest.mark.parametrize(
    "resources, says",
    [
        ("{ count: 1 }", "resources[0]: a resource needs a name"),
        ('{ name: "R" count: 1 }, { name: "R" count: 2 }', "resources[1]: resource 'R' is listed twice"),
    ],
)
def test_a_bad_rate_limiter_block_is_refused_naming_the_field(resources: str, says: str) -> None:
    from engine.config.rate_limiter import read_rate_limiter
    from engine.config.repository import parse_config_text
    from engine.errors import ModelConfigError

    config = parse_config_text(f"instance_group [ {{ rate_limiter {{ resources [ {resources} ] }} }} ]", "m")
    with pytest.raises(ModelConfigError, match=says.replace("[", r"\[").replace("]", r"\]")):
        read_rate_limiter(config, "model 'm'")


def test_a_model_registered_later_starts_level_with_the_least_run_model() -> None:
    pool = ResourcePool()
    pool.register("old/1", needs(("R", 1)))
    for _ in range(5):
        pool.arrive("old/1").release()  # old ran five times before new was loaded
    pool.register("new/1", needs(("R", 1)))
    held = pool.arrive("old/1")
    served = []
    for _ in range(4):  # one waiter of each model at every hand-off, old's first
        queued = [pool.arrive("old/1"), pool.arrive("new/1")]
        held.release()
        (held,) = [w for w in queued if w.state is WaiterState.GRANTED]
        served.append(held.model.split("/")[0])
        for waiter in queued:
            if waiter is not held:
                pool._withdraw(waiter, WaiterState.CANCELLED)
    assert served == ["new", "old", "new", "old"]  # from 0, new would have taken the first five turns
