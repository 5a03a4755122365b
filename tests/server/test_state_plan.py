"""ServerState.plan: the shape a request's model loads with."""

from server_fakes import FakeModels, FakeStarter, served

from ember.server.scheduler import Defaults, Scheduler
from ember.server.state import VISION_MIN_CTX, ServerState

SEES = frozenset({"completion", "vision"})
MODELS = {
    "seer": served("seer", capabilities=SEES),
    "short-seer": served("short-seer", capabilities=SEES, context_length=1024),
    "fake": served("fake"),
}


def state(default_ctx: int = 4096) -> ServerState:
    scheduler = Scheduler(start=FakeStarter(), defaults=Defaults(num_ctx=default_ctx))
    return ServerState(FakeModels(MODELS), scheduler, num_ctx=default_ctx)  # type: ignore[arg-type]


def test_a_vision_model_loads_at_least_ollamas_2048() -> None:
    assert state().plan("seer", {"num_ctx": 40}).shape.num_ctx == VISION_MIN_CTX == 2048
    assert state(default_ctx=1024).plan("seer", None).shape.num_ctx == 2048
    assert state().plan("seer", None).shape.num_ctx is None  # the default of 4096 is enough
    assert state().plan("seer", {"num_ctx": 3000}).shape.num_ctx == 3000
    # then, as any model, no more than it was trained for
    assert state().plan("short-seer", {"num_ctx": 40}).shape.num_ctx == 1024
    assert state().plan("fake", {"num_ctx": 40}).shape.num_ctx == 40  # a text model as asked
