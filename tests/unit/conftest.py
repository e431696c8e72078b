"""Fixtures the unit tests share."""

from __future__ import annotations

import pytest


@pytest.fixture()
def home(tmp_path, monkeypatch):
    """A state folder of the test's own (``STOKER_HOME``): runs, lines and leases land there."""
    monkeypatch.setenv("STOKER_HOME", str(tmp_path))
    return tmp_path
