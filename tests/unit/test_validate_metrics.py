"""Parsing real /metrics text captured from vLLM 0.32.0 (CPU) serving a tiny Llama with EAGLE-3 drafts (3
speculative tokens): an untrained draft before and after three requests of 40 tokens, and the demo
target with a draft trained by the pipeline's code after three such requests."""

from pathlib import Path

import pytest

from eagle3_pipeline.validate.acceptance import online_acceptance
from eagle3_pipeline.validate.metrics import SpecDecodeCounters, parse_prometheus, spec_decode_counters

DATA = Path(__file__).parents[1] / "data" / "validate"


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_real_metrics_text_parses_every_line():
    samples = parse_prometheus(read("vllm-0.32.0-metrics-untrained-draft.txt"))
    assert len(samples) > 100
    names = {s.name for s in samples}
    assert "vllm:spec_decode_num_accepted_tokens_per_pos_total" in names
    assert "vllm:spec_decode_num_drafts_created" in names  # a gauge of the same family: not a counter


def test_real_spec_decode_counters():
    after = spec_decode_counters(parse_prometheus(read("vllm-0.32.0-metrics-untrained-draft.txt")))
    assert after == SpecDecodeCounters(
        drafts=117, draft_tokens=351, accepted_tokens=0, accepted_per_position=(0, 0, 0)
    )
    before = spec_decode_counters(parse_prometheus(read("vllm-0.32.0-metrics-before.txt")))
    result = online_acceptance(before, after)
    assert result.drafts == 117 - before.drafts
    assert result.acceptance_length == pytest.approx(1.0)  # an untrained draft: nothing accepted


def test_counters_sum_over_engines_and_filter_by_model():
    text = (
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 45\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 8\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 12\n'
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="other"} 99\n'
    )
    counters = spec_decode_counters(parse_prometheus(text), model_name="m")
    assert counters == SpecDecodeCounters(15, 45, 20, (12, 8))


def test_label_values_with_escapes_and_commas():
    (sample,) = parse_prometheus('x{a="q\\"uote, comma",b="back\\\\slash"} 1.5e+02 1700000000\n')
    assert sample.labels == {"a": 'q"uote, comma', "b": "back\\slash"}
    assert sample.value == 150.0


def test_a_server_without_speculative_decoding_is_named():
    with pytest.raises(ValueError, match="speculative-config"):
        spec_decode_counters(parse_prometheus("vllm:num_requests_running 0\n"))


def test_garbage_line_is_named():
    with pytest.raises(ValueError, match="unreadable /metrics line"):
        parse_prometheus("this is not { prometheus\n")


def test_real_counters_of_a_trained_draft():
    """Captured after three 40-token greedy requests to the demo target with a trained draft."""
    counters = spec_decode_counters(parse_prometheus(read("vllm-0.32.0-metrics-trained-draft.txt")))
    assert counters == SpecDecodeCounters(35, 105, 86, (32, 28, 26))
    assert sum(counters.accepted_per_position) == counters.accepted_tokens  # position i: first i+1 accepted
    result = online_acceptance(SpecDecodeCounters(0, 0, 0, (0, 0, 0)), counters)
    assert result.acceptance_length == pytest.approx(1 + 86 / 35)
    assert result.conditional == pytest.approx([32 / 35, 28 / 32, 26 / 28])
