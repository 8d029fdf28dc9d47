"""The preflight against a scripted endpoint: what it proves, what it refuses in seconds, and the
count of prompts that do not fit max_model_len. A real vLLM server is checked in
tests/integration/test_generation.py; the scripted endpoint stands in only for the faults no current
vLLM shows (an old server that ignores return_token_ids)."""

import polars as pl
import pytest

from eagle3_pipeline.generate.payload import Sampling
from eagle3_pipeline.generate.preflight import PreflightError, fit_report, run_preflight
from eagle3_pipeline.prompts import PROMPT_SCHEMA
from eagle3_pipeline.server_json import ServerSnapshot


def selection(tmp_path, questions):
    n = len(questions)
    frame = pl.DataFrame(
        {
            "id": [f"id{i}" for i in range(n)],
            "source": ["s"] * n,
            "row": list(range(n)),
            "turn": [0] * n,
            "system": [None] * n,
            "question": questions,
            "original_answer": [None] * n,
        },
        schema=PROMPT_SCHEMA,
    )
    path = tmp_path / "selection.parquet"
    frame.write_parquet(path)
    return path


def preflight(endpoint, tmp_path, questions=("q",), max_tokens=16, parser="kimi_k2", model="demo", **kw):
    return run_preflight(
        endpoint.base_url,
        Sampling(model, max_tokens, 0.6, 0.95, None, kw),
        ServerSnapshot.from_json({"reasoning_parser": parser}),
        selection(tmp_path, list(questions)),
    )


def test_a_good_server_passes_and_the_prompts_that_do_not_fit_are_counted(scripted_endpoint, tmp_path):
    questions = ["short one", "word " * 30, "word " * 60, "a b c"]  # endpoint: a token per word, + 4
    result = preflight(scripted_endpoint, tmp_path, questions, max_tokens=16)
    assert result["token_ids"] is True and result["reasoning"] == "returned"
    assert result["max_model_len"] == 64 and result["served_model_name"] == "demo"
    # 30 + 4 + 16 fits 64; 60 + 4 + 16 does not
    assert result["fit"] == {"prompts": 4, "counted": 4, "over_max_model_len": 1, "at_least": False}
    assert scripted_endpoint.bodies[0]["return_token_ids"] is True


def test_a_server_that_ignores_return_token_ids_is_refused_in_seconds(scripted_endpoint, tmp_path):
    scripted_endpoint.token_ids = False  # what vLLM < 0.10.2 does
    with pytest.raises(PreflightError, match=r"ignores return_token_ids .* vLLM >= 0.10.2"):
        preflight(scripted_endpoint, tmp_path)
    assert len(scripted_endpoint.bodies) == 1  # one short request, before any shard


def test_an_unknown_served_name_is_refused_naming_what_is_served(scripted_endpoint, tmp_path):
    with pytest.raises(PreflightError, match=r"does not serve 'other' \(it serves \['demo'\]\)"):
        preflight(scripted_endpoint, tmp_path, model="other")


def test_max_tokens_without_room_for_a_prompt_is_refused(scripted_endpoint, tmp_path):
    with pytest.raises(PreflightError, match="generation.max_tokens = 64 leaves no room"):
        preflight(scripted_endpoint, tmp_path, max_tokens=64)


def test_missing_reasoning_with_a_parser_configured_is_refused_unless_thinking_is_off(
    scripted_endpoint, tmp_path
):
    scripted_endpoint.reasoning_parser = False  # the reply carries thinking inside the content
    with pytest.raises(PreflightError, match="reasoning parser 'kimi_k2', but the reply has no reasoning"):
        preflight(scripted_endpoint, tmp_path)
    assert preflight(scripted_endpoint, tmp_path, thinking=False)["reasoning"] == "thinking off"
    assert preflight(scripted_endpoint, tmp_path, parser=None)["reasoning"] == "not expected"


def test_fit_is_a_lower_bound_when_the_shortest_counted_prompt_does_not_fit():
    assert fit_report([90, 80], 10, 16, 64)["at_least"] is True
    assert fit_report([90, 10], 10, 16, 64) == {
        "prompts": 10,
        "counted": 2,
        "over_max_model_len": 1,
        "at_least": False,
    }
