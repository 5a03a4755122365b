"""Fixtures the route tests share: a fake runner starter and a client of an app over it."""

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from server_fakes import FakeStarter, fake_state

from ember.server.app import create_app


@pytest.fixture
def starter() -> FakeStarter:
    return FakeStarter()


@pytest.fixture
def client(starter: FakeStarter) -> Iterator[TestClient]:
    with TestClient(create_app(fake_state(starter))) as c:
        yield c
