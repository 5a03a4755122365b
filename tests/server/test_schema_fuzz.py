"""schemathesis over the OpenAPI schema the server publishes (/openapi.json), in-process against
the app behind its middleware, with fake runners (no model), a temporary model store, and a
registry that answers 404 to everything (no network): no 5xx and no logged exception."""

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from server_fakes import MODELS, fake_state  # noqa: E402

from ember.envconfig import parse_host  # noqa: E402
from ember.server import middleware, model_routes  # noqa: E402
from ember.server.app import create_app  # noqa: E402
from ember.store import Registry, Store  # noqa: E402

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 15  # per operation: about 300 cases over the 26 operations, < 3 minutes
CASES: list[str] = []


class OfflineRegistry(Registry):
    """The real registry client over a transport where every address answers 404."""

    def __init__(self, store: Store, **kwargs: Any) -> None:
        transport = httpx.MockTransport(lambda request: httpx.Response(404, json={"errors": []}))
        super().__init__(store, client=httpx.Client(transport=transport), **kwargs)


def refuse_install(entry: Any) -> None:
    raise model_routes.EmberError("installing packages is off in this test")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    app = create_app(fake_state())
    app.state.store = Store(Path(tmp_path_factory.mktemp("fuzz_store")))
    app.state.catalogue_install = refuse_install
    # schemathesis' ASGI client sends Host: testserver; the bound host is always allowed
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model_routes, "Registry", OfflineRegistry)
        yield middleware.install(
            app, bound=parse_host("testserver:11434"), origins=(), api_key=None
        )


@pytest.fixture(scope="module")
def api_schema(app: Any) -> Any:
    return schemathesis.openapi.from_asgi("/openapi.json", app)


# schemathesis' pytest plugin reads a node attribute pytest 9 no longer has: each operation is
# a parametrized test here, its cases drawn by hypothesis from schemathesis' strategy
OPERATIONS = [
    (path, method.upper())
    for path, item in create_app(fake_state()).openapi()["paths"].items()
    for method in item
]


@pytest.mark.parametrize(("path", "method"), OPERATIONS)
def test_no_input_makes_a_server_error_or_a_logged_exception(api_schema, caplog, path, method):
    operation = api_schema[path][method]

    cases = st.one_of(operation.as_strategy(mode) for mode in GenerationMode)

    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=cases, model=st.sampled_from(["", *MODELS]))
    def fuzz(case: Any, model: str) -> None:
        if model and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = model  # a model the fakes serve: past the 404, into the flows
        CASES.append(operation.label)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="ember"):
            response = case.call()
        case.validate_response(response, checks=[not_a_server_error])
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert not errors, errors[0].getMessage()

    fuzz()


def test_the_fuzz_ran_a_few_hundred_cases() -> None:
    print(f"schemathesis cases: {len(CASES)} over {len(set(CASES))} operations")
    assert len(CASES) >= 200 or not CASES  # empty: run alone, without the fuzz above
