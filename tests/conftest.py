"""Shared pytest setup: reusable fixtures live in tests/support/*.py and are registered here."""

pytest_plugins = [
    "support.draft",
    "support.generation_server",
    "support.hidden_states",
    "support.http_endpoint",
    "support.sshd",
    "support.traces",
    "support.vllm_server",
    "support.workflow",
]
