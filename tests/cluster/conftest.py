from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.nats import NatsServer


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "nats")
    server.start()
    yield server
    server.stop()
