import pytest

from ember.backend import native


@pytest.fixture(params=[False, True], ids=["fast_gathers", "slow_gathers"])
def gathers(request: pytest.FixtureRequest):
    """Runs a test with vnni.h's choice of rows for each kind of CPU (native.set_slow_gathers),
    whatever this one is; yields whether gathers count as slow."""
    chosen = native.slow_gathers()
    native.set_slow_gathers(request.param)
    yield request.param
    native.set_slow_gathers(chosen)
