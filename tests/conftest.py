"""Shared pytest setup: reusable fixtures live in tests/support/*.py and are registered here."""

pytest_plugins = [
    "support.http_endpoint",
]
