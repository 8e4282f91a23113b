"""What the dashboard tests share: a page served by the test process."""
from __future__ import annotations

import pytest


@pytest.fixture
def page():
    """The URL of the page served by this test process (stopped after)."""
    from fiberlite import dashboard
    url = dashboard.start(("127.0.0.1", 0))
    yield url
    dashboard.stop()
