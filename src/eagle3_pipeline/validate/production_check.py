"""The serve check on a systemd unit (production over SSH, or this machine when it runs systemd): the
draft's checkpoint copied to the host (remote_checkpoint.py), the draft served by a check unit of its
own that conflicts production, whose stop systemd follows by starting production again
(server/check_unit.py, server/host_record.py), the questions measured in between.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from eagle3_pipeline.generate.client import Sampling
from eagle3_pipeline.server.draft_command import draft_argv, vllm_exec
from eagle3_pipeline.server.host_record import recover_leftover, restart_timeout_s, serve_check_unit
from eagle3_pipeline.server.interrupts import interrupts_as_exceptions
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.settings import ServerSettings, ValidateSettings


def _production_check(
    server: ServerSettings, snapshot: ServerSnapshot, state_dir: Path
) -> Callable[[], None]:
    """/health through the configured URL (tunnel included), then /v1/models lists the snapshot's model."""
    from eagle3_pipeline.server import auth_headers, tls_verify
    from eagle3_pipeline.server.health import check_model, wait_healthy
    from eagle3_pipeline.server.lifecycle import server_url

    def check() -> None:
        headers, verify = auth_headers(server), tls_verify(server)
        base_url = server_url(snapshot, server, state_dir)
        wait_healthy(base_url, server.start_timeout_s, None, None, headers, verify=verify)
        check_model(base_url, snapshot.served_model_name, headers, verify)

    return check


def run_remote_serve_check(
    server: ServerSettings,
    validate: ValidateSettings,
    snapshot: ServerSnapshot | Mapping[str, Any],
    checkpoint_dir: str | Path,
    questions: list[dict],
    sampling: Sampling,
    state_dir: str | Path,
    concurrency: int = 8,
    request_timeout_s: float = 600.0,
    matched: tuple[list[dict], Sampling] | None = None,
) -> dict[str, Any]:
    """The serve check through systemd (an SSH host, or this machine when it runs systemd): the draft
    (validate.num_speculative_tokens, validate.enforce_eager; copied under validate.remote_dir on an SSH
    host) in the unit, the questions measured, the unit restored. `matched`: a second run's questions
    and sampling, its figures under "sampled" (as local_vllm.run_local_checks)."""
    from eagle3_pipeline.server import api_key, auth_headers, tls_verify
    from eagle3_pipeline.server.health import wait_healthy
    from eagle3_pipeline.server.lifecycle import server_url
    from eagle3_pipeline.server.remote import open_host
    from eagle3_pipeline.server.snapshot import read_unit_text
    from eagle3_pipeline.server.unit_watch import UnitWatch
    from eagle3_pipeline.validate import remote_checkpoint
    from eagle3_pipeline.validate.spec_decode import measure

    unit, sudo, record_dir = server.unit, server.ssh.sudo, server.host_state_dir
    timeout_s = restart_timeout_s(server)
    snapshot = ServerSnapshot.of(snapshot)  # server.json (tests may pass its dict)
    verify = _production_check(server, snapshot, Path(state_dir))
    with interrupts_as_exceptions():
        host = open_host(server)
        folder = None
        try:
            recover_leftover(  # first: a check killed earlier leaves the unit as it found it
                host, unit, record_dir=record_dir, sudo=sudo, timeout_s=timeout_s, verify=verify
            )
            cat_text = read_unit_text(host, server)
            command = vllm_exec(cat_text, unit)
            expected = remote_checkpoint.sha256_files(checkpoint_dir)
            if host.is_local:
                checkpoint = str(Path(checkpoint_dir).resolve())
            else:
                sandbox = remote_checkpoint.unit_sandbox(cat_text, unit)
                folder = checkpoint = remote_checkpoint.private_dir(host, validate.remote_dir, sandbox)
                remote_checkpoint.upload(host, checkpoint_dir, folder)
            argv = draft_argv(command, checkpoint, validate.num_speculative_tokens, validate.enforce_eager)
            with serve_check_unit(
                host, unit, argv, record_dir=record_dir, sudo=sudo, timeout_s=timeout_s,
                runtime_max_s=check_time_limit_s(server, len(questions), concurrency, request_timeout_s,
                                                 matched is not None),
                before_start=lambda: remote_checkpoint.verify(host, checkpoint, expected), verify=verify,
                draft_path=checkpoint, expand_environment=":" not in command.prefixes,
                lease_s=server.check_lease_s,
            ) as check:  # fmt: skip
                run_id = check.run_id
                base_url = server_url(snapshot, server, Path(state_dir))
                watch = UnitWatch(server, unit=check.name)
                try:
                    wait_healthy(
                        base_url, server.start_timeout_s, watch.journal, watch.alive, auth_headers(server),
                        lambda: f"{check.name} (the draft) stopped ({watch.state})", tls_verify(server),
                    )  # fmt: skip
                finally:
                    watch.close()
                key = api_key(server)
                result = measure(
                    base_url,
                    questions,
                    sampling,
                    key,
                    concurrency,
                    request_timeout_s,
                    ca_bundle=server.ca_bundle,
                )
                if matched is not None:
                    result["sampled"] = measure(
                        base_url, *matched, key, concurrency, request_timeout_s, ca_bundle=server.ca_bundle
                    )
                check.still_serving()  # the figures are the draft's: its unit ran throughout
        finally:
            if folder is not None:
                remote_checkpoint.remove(host, folder)
            host.close()
    return result | {"mode": "systemd-check-unit", "unit": unit, "host": server.host, "run_id": run_id}


def check_time_limit_s(
    server: ServerSettings, questions: int, concurrency: int, request_timeout_s: float, two_runs: bool
) -> float:
    """The check unit's RuntimeMaxSec: its start, every round of requests at their timeout (twice with
    the matched run), and a margin; past it systemd stops the check and starts production again."""
    rounds = -(-questions // max(1, concurrency)) * (2 if two_runs else 1)
    return server.start_timeout_s + rounds * request_timeout_s + 600
