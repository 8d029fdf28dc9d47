"""The serve check's main scenarios again on a newer systemd: Debian bookworm-backports' 254
(support.real_systemd.fetch_release), the first release with `systemd-run --expand-environment=`,
which the check does not use. The tests are test_serve_check_real_systemd.py's own, run here with
`systemd_host` booting 254: the draft after production's stop and production after the draft's last
process, the restore with Environment=, the lease after a SIGKILL, an operator's start, the property
round trip through a real `systemd-run`, a literal `$`, and a refusal.
"""

from __future__ import annotations

import pytest
from test_serve_check_real_systemd import fast_polls as fast_polls  # noqa: F401 (fixtures)
from test_serve_check_real_systemd import host as host  # noqa: F401
from test_serve_check_real_systemd import (  # noqa: F401 (collected here, on 254)
    test_a_dbus_unit_is_refused,
    test_a_literal_dollar_reaches_the_draft_as_written,
    test_an_operator_starts_production_during_the_check,
    test_the_check_units_settings_as_systemd_applied_them,
    test_the_draft_serves_after_production_has_stopped_and_systemd_restores_production,
    test_the_pipeline_sigkilled_mid_check_production_back_within_the_lease,
)
from test_serve_check_real_systemd import wrappers as wrappers  # noqa: F401

pytestmark = [pytest.mark.systemd, pytest.mark.ssh]


@pytest.fixture(scope="module")
def systemd_host(newer_systemd_host):
    assert newer_systemd_host.systemd.version().startswith("systemd 254")
    return newer_systemd_host
