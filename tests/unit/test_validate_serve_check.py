"""The draft-serving command line (the local server's, the check unit's) and the serve check's request
settings."""

import dataclasses
import json
import socket
from pathlib import Path

import pytest
import yaml

from eagle3_pipeline.config import check_config
from eagle3_pipeline.generate.payload import Sampling, chat_body, request_seed
from eagle3_pipeline.ports import PortError, free_port, reserved_port
from eagle3_pipeline.server.draft_command import ServeCheckError, draft_argv, vllm_exec
from eagle3_pipeline.server.unit import ExecCommand
from eagle3_pipeline.server.vllm_args import eagle3_draft, serving_argv
from eagle3_pipeline.settings import GenerationSettings, ValidateSettings, build_settings
from eagle3_pipeline.validate.serve_check import _sampling_dict, matched_sampling, serve_sampling
from eagle3_pipeline.validate.spec_decode import ask

ARGV = [
    "/venv/bin/python",
    "-m",
    "vllm.entrypoints.openai.api_server",
    "--model",
    "/m",
    "--port",
    "8000",
    "--host=0.0.0.0",
    "--speculative_config",
    '{"method":"ngram"}',
    "--max-model-len",
    "2048",
]


def spec_of(words):
    return json.loads(words[words.index("--speculative-config") + 1])


def test_draft_added_and_the_units_own_host_port_and_spec_replaced():
    words = serving_argv(ARGV, eagle3_draft("/ckpt", 3), "127.0.0.1", 18590, enforce_eager=True)
    assert spec_of(words) == {"method": "eagle3", "model": "/ckpt", "num_speculative_tokens": 3}
    assert words.count("--speculative-config") == 1 and "--speculative_config" not in words
    assert '{"method":"ngram"}' not in words
    assert words[words.index("--port") + 1] == "18590" and "8000" not in words
    assert "--host=0.0.0.0" not in words and words[words.index("--host") + 1] == "127.0.0.1"
    assert words[-1] == "--enforce-eager"
    assert words[:5] == ARGV[:5] and "--max-model-len" in words


def test_host_port_kept_when_not_given_and_eager_not_doubled():
    words = serving_argv([*ARGV, "--enforce_eager"], eagle3_draft("ckpt", 2), enforce_eager=True)
    assert "8000" in words and "--host=0.0.0.0" in words
    assert sum(w.replace("_", "-") == "--enforce-eager" for w in words) == 1
    assert spec_of(words)["model"].startswith("/")  # made absolute: the server's cwd may differ


def test_free_port_skips_a_taken_one():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 18599))
        taken.listen()
        with pytest.raises(PortError, match="no free port"):
            free_port(18599, 18599)
    assert free_port(18599, 18599) == 18599


def test_a_reserved_port_is_taken_for_everyone_but_the_server_started_on_it():
    """Two checks starting at once cannot pick the same port: the reservation is held until the server
    answers, and a server binding it as vLLM does (SO_REUSEADDR) can still listen on it."""
    with reserved_port(18598, 18598) as port:
        assert port == 18598
        with pytest.raises(PortError, match="no free port"):
            free_port(18598, 18598)
        with pytest.raises(PortError, match="no free port"), reserved_port(18598, 18598):
            pass
    assert free_port(18598, 18598) == 18598  # released
    with reserved_port(18598, 18598) as port, socket.socket() as server:  # vLLM's create_server_socket
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen()
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        accepted = server.accept()[0]  # connections reach the server, not the reservation
        client.close()  # first, so that TIME_WAIT holds the client's port, not 18598
        assert accepted.recv(1) == b""
        accepted.close()


def test_the_draft_command_keeps_production_words():
    command = ExecCommand(prefixes="-", raw="/usr/bin/vllm serve /models/kimi --port 8000 --api-key $KEY")
    words = draft_argv(command, "/var/tmp/ckpt", 3, enforce_eager=False)
    assert words[:5] == ["/usr/bin/vllm", "serve", "/models/kimi", "--port", "8000"]
    assert spec_of(words)["model"] == "/var/tmp/ckpt"
    assert "$KEY" in words and "--enforce-eager" not in words  # $KEY: systemd expands it, as for production


def test_a_shell_that_passes_its_arguments_to_vllm_gets_the_draft_flags_at_the_end():
    """`bash -c '... exec vllm serve "$@"' vllm ARGS`: appended words reach vLLM's own line."""
    script = 'source /v/bin/activate && exec vllm serve "$@"'
    words = draft_argv(ExecCommand("", f"/bin/bash -c '{script}' vllm /m --port 8000"), "/c", 3, True)
    assert words[:7] == ["/bin/bash", "-c", script, "vllm", "/m", "--port", "8000"]
    assert words[7] == "--speculative-config" and words[9:] == ["--enforce-eager"]
    assert spec_of(words)["model"] == "/c"


def test_argv0_is_dropped_and_privilege_prefixes_refused():
    """`@`: the second word is argv[0] only; `+`/`!` cannot be carried by a transient unit's command."""
    words = draft_argv(ExecCommand("@", "/opt/venv/bin/vllm vllm-prod serve /m"), "/c", 3, False)
    assert words[:3] == ["/opt/venv/bin/vllm", "serve", "/m"]
    for prefix in ("+", "!", "!!"):
        with pytest.raises(ServeCheckError, match="privilege prefix"):
            draft_argv(ExecCommand(prefix, "/usr/bin/vllm serve /m"), "/c", 3, False)


def test_the_draft_command_refuses_a_shell_wrapper_and_non_vllm():
    with pytest.raises(ServeCheckError, match="shell"):
        draft_argv(ExecCommand("", "/bin/bash -c 'vllm serve /m --port 1'"), "/c", 3, True)
    with pytest.raises(ServeCheckError, match="not vLLM"):
        draft_argv(ExecCommand("", "/opt/start-server.sh"), "/c", 3, True)


def test_vllm_exec_follows_dropins():
    cat = (
        "# /etc/systemd/system/v.service\n[Service]\nExecStartPre=/bin/true\n"
        "ExecStart=/usr/bin/vllm serve /a\n"
        "# /etc/systemd/system/v.service.d/o.conf\n[Service]\nExecStart=\nExecStart=/usr/bin/vllm serve /b\n"
    )
    assert vllm_exec(cat, "v.service").raw == "/usr/bin/vllm serve /b"


def test_serve_sampling_caps_max_tokens_and_sets_temperature():
    generation = GenerationSettings(max_tokens=8192, temperature=0.6, top_p=0.95, seed=0)
    greedy = serve_sampling(generation, ValidateSettings(max_tokens=128, temperature=0.0), "m")
    assert (greedy.max_tokens, greedy.temperature, greedy.top_p) == (128, 0.0, 0.95)
    same = serve_sampling(generation, ValidateSettings(max_tokens=None, temperature=None), "m")
    assert (same.max_tokens, same.temperature) == (8192, 0.6)


# a generation section setting every sampling value a request can carry (stop through extra_body)
EVERY_VALUE = {
    "max_tokens": 4096,
    "temperature": 0.7,
    "top_p": 0.9,
    "seed": 11,
    "top_k": 20,
    "min_p": 0.05,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.25,
    "repetition_penalty": 1.1,
    "chat_template_kwargs": {"enable_thinking": True},
    "extra_body": {"stop": ["<|im_end|>"], "min_tokens": 4, "skip_special_tokens": False},
}


def every_value_settings(monkeypatch):
    """The demo config with EVERY_VALUE as its generation section, validated as a run's config is."""
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)  # dataset.path is relative to the workflow directory
    raw = yaml.safe_load((root / "config" / "config.yaml").read_text())
    raw["generation"] |= EVERY_VALUE
    raw["validate"] |= {"max_tokens": 256, "temperature": 0.0}
    return build_settings(check_config(raw, root / "config" / "schema.yaml"))


def test_every_field_of_the_sampling_is_set_by_the_test_config():
    """A field added to Sampling without a value here would go unchecked by the next test."""
    assert {f.name for f in dataclasses.fields(Sampling)} - {"model"} == set(EVERY_VALUE)


def test_the_serve_checks_requests_carry_the_generations_sampling_whole(monkeypatch, scripted_endpoint):
    """Both runs' bodies, as a real HTTP endpoint receives them, are the generation's request for the
    same question but for what the check sets itself: max_tokens (capped) and the first run's
    temperature (validate.temperature)."""
    settings = every_value_settings(monkeypatch)
    generation, validate, model = settings.generation, settings.validate, scripted_endpoint.model
    question = {"id": "v0", "system": "sys", "question": "what is 2+2?"}
    generated = json.loads(chat_body(question, Sampling.from_settings(generation, model)))
    overrides = {
        "greedy": ({"max_tokens": 256, "temperature": 0.0}, serve_sampling(generation, validate, model)),
        "sampled": ({"max_tokens": 256}, matched_sampling(generation, validate, model)),
    }
    for name, (changed, sampling) in overrides.items():
        scripted_endpoint.bodies.clear()
        outcome = ask(scripted_endpoint.base_url, [question], sampling, None, 1, 30, 0)
        assert outcome[0]["status"] == "ok", name
        (sent,) = scripted_endpoint.bodies
        assert sent == generated | changed, name
        for key in ("top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "top_p"):
            assert sent[key] == EVERY_VALUE[key], (name, key)
        assert sent["seed"] == request_seed(EVERY_VALUE["seed"], "v0")
        assert sent["chat_template_kwargs"] == {"enable_thinking": True}
        assert {k: sent[k] for k in EVERY_VALUE["extra_body"]} == EVERY_VALUE["extra_body"]
    assert generated["temperature"] == 0.7 and generated["max_tokens"] == 4096
    # and serve_check.json records each run's sampling whole
    recorded = _sampling_dict(overrides["greedy"][1])
    assert recorded == EVERY_VALUE | {"model": model, "max_tokens": 256, "temperature": 0.0}


HEALTH_SERVER = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def test_a_port_taken_by_another_server_while_the_check_starts_is_never_measured(tmp_path):
    """The race of two checks starting on one host at once: the first port's /health is answered by a
    server that is not the check's own process (it took the port between the free-port test and the
    bind): that process is stopped and another port tried; the second attempt's own server is used."""
    import http.server
    import sys
    import threading

    from eagle3_pipeline.server.process_identity import group_listens_on
    from eagle3_pipeline.validate.local_vllm import serve_local

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    foreign, ports = [], []

    def command_on(port: int) -> list[str]:
        ports.append(port)
        if len(ports) == 1:  # somebody else's server takes the port first; ours never binds it
            foreign.append(http.server.ThreadingHTTPServer(("127.0.0.1", port), Health))
            threading.Thread(target=foreign[0].serve_forever, daemon=True).start()
            return ["sleep", "60"]
        return [sys.executable, "-c", HEALTH_SERVER, str(port)]

    try:
        handle, base_url = serve_local(command_on, {}, None, tmp_path, 30, (18610, 18619))
        try:
            assert len(ports) == 2 and ports[0] != ports[1] and base_url.endswith(f":{ports[1]}")
            assert group_listens_on(handle.pid, ports[1]) is True
            assert group_listens_on(handle.pid, ports[0]) is False  # the foreign one is not its
        finally:
            handle.stop()
    finally:
        foreign[0].shutdown()
        foreign[0].server_close()


def test_an_inline_chat_template_with_a_newline_stays_one_word_of_the_draft_command():
    """An inline --chat-template written with systemd's C escapes (`\\n`, `\\t`: a raw newline would end
    the ExecStart= line) reaches the check unit's argv as the one word systemd decodes."""
    written = r'"{{ bos_token }}\n{{ messages[0][\'content\'] }}\t"'
    line = f"ExecStart=/opt/venv/bin/vllm serve /m --chat-template {written}"
    cat = f"# /etc/systemd/system/v.service\n[Service]\n{line}\n"
    words = draft_argv(vllm_exec(cat, "v.service"), "/c", 3, enforce_eager=False)
    assert words[words.index("--chat-template") + 1] == "{{ bos_token }}\n{{ messages[0]['content'] }}\t"


# A stand-in server that starts only once all `expected` stand-ins have been launched (a barrier on a
# shared file): a check that waited for each /health before launching the next would never see one.
BARRIER_SERVER = """
import http.server, json, os, sys, time
barrier, expected = sys.argv[1], int(sys.argv[2])
port = int(sys.argv[sys.argv.index("--port") + 1])
spec = sys.argv[sys.argv.index("--speculative-config") + 1] if "--speculative-config" in sys.argv else "{}"
if json.loads(spec).get("model", "").endswith("broken"):
    sys.exit("a draft that does not load")
with open(barrier, "a") as f:
    f.write(f"{port}\\n")
while len(open(barrier).read().split()) < expected:
    time.sleep(0.05)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def barrier_servers(monkeypatch, tmp_path, expected):
    import sys

    from eagle3_pipeline.settings import ServerSettings
    from eagle3_pipeline.validate import local_vllm

    barrier = tmp_path / "barrier"
    argv = [sys.executable, "-c", BARRIER_SERVER, str(barrier), str(expected)]
    monkeypatch.setattr(local_vllm, "local_command", lambda server: (argv, {}, None))
    return ServerSettings(host="local", start_timeout_s=30), barrier


def test_the_local_checks_servers_start_together_each_on_its_own_port(monkeypatch, tmp_path):
    """by-k's servers and the target alone start with the check's (local_vllm.start_local_servers): all
    three are launched before any answers /health (the stand-ins wait for each other), each on a port
    of its own, and every one is stopped by its handle."""
    from eagle3_pipeline.server.process_identity import group_listens_on
    from eagle3_pipeline.validate.local_vllm import start_local_servers

    server, barrier = barrier_servers(monkeypatch, tmp_path, 3)
    specs = {
        "check": (eagle3_draft(str(tmp_path / "draft"), 3), tmp_path / "check"),
        "k1": (eagle3_draft(str(tmp_path / "draft"), 1), tmp_path / "k1"),
        "without_draft": (None, tmp_path / "without"),
    }
    started = start_local_servers(server, ValidateSettings(), specs, port_range=(18620, 18639))
    try:
        assert set(started) == set(specs)
        ports = [int(url.rsplit(":", 1)[1]) for _, url in started.values()]
        assert len(set(ports)) == 3 and sorted(ports) == sorted(map(int, barrier.read_text().split()))
        assert all(
            group_listens_on(handle.pid, port)
            for (handle, _), port in zip(started.values(), ports, strict=True)
        )
    finally:
        for handle, _ in started.values():
            handle.stop()
    assert not any(handle.alive() for handle, _ in started.values())


def test_one_server_that_fails_to_start_stops_the_others(monkeypatch, tmp_path):
    """A draft server that exits at start fails the check with its error, and the servers started beside
    it are stopped, not left running."""
    from eagle3_pipeline.server.health import ServerError
    from eagle3_pipeline.validate import local_vllm

    server, _ = barrier_servers(monkeypatch, tmp_path, 2)
    handles = []
    serve_local = local_vllm.serve_local
    monkeypatch.setattr(
        local_vllm, "serve_local", lambda *args: handles.append(serve_local(*args)) or handles[-1]
    )
    specs = {
        "check": (eagle3_draft(str(tmp_path / "draft"), 3), tmp_path / "check"),
        "k1": (eagle3_draft(str(tmp_path / "broken"), 1), tmp_path / "k1"),
        "without_draft": (None, tmp_path / "without"),
    }
    with pytest.raises(ServerError, match="exited"):
        local_vllm.start_local_servers(server, ValidateSettings(), specs, port_range=(18640, 18659))
    assert len(handles) == 2 and not any(handle.alive() for handle, _ in handles)
