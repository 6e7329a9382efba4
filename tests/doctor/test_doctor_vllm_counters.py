"""doctor/vllm_model/counters.py: vLLM's /metrics speculative counters, parsed and predicted."""
import pytest
from hypothesis import given, strategies as st

from eagle3_capture.doctor.common import DoctorError
from eagle3_capture.doctor.vllm_model import SpecCounters, parse_spec_counters, predicted_counters

TEXT = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 95.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 285.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 97.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 45.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 25.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 24.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="2"} 3.0
vllm:spec_decode_num_drafts_created 1.7e9
"""


def test_parse_sums_engines_and_keeps_positions():
    c = parse_spec_counters(TEXT)
    assert c == SpecCounters(95, 285, 97, [45, 25, 27])
    assert abs(c.accept_length - (1 + 97 / 95)) < 1e-12


def test_window_and_bad_inputs():
    a = parse_spec_counters(TEXT)
    assert a - a == SpecCounters(0, 0, 0, [0, 0, 0])
    with pytest.raises(DoctorError, match="went down"):
        SpecCounters(0, 0, 0, [0]) - a
    with pytest.raises(DoctorError, match="no vllm:spec_decode"):
        parse_spec_counters("sglang:spec_accept_length 2.0\n")
    with pytest.raises(DoctorError, match="not a number"):
        parse_spec_counters("vllm:spec_decode_num_drafts_total abc\n")
    with pytest.raises(DoctorError, match="whole count"):
        parse_spec_counters("vllm:spec_decode_num_drafts_total -1\n")
    with pytest.raises(DoctorError, match="no position"):
        parse_spec_counters("vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\"} 1\n")
    with pytest.raises(DoctorError, match="at most 4"):
        predicted_counters([1, 2, 3, 4, 5], 3)
    with pytest.raises(DoctorError, match="positive integer"):
        predicted_counters([1], 0)


@given(st.integers(1, 6).flatmap(lambda k: st.tuples(st.just(k), st.lists(st.integers(0, 50), min_size=1,
                                                                             max_size=k + 1))))
def test_predicted_counters_from_a_histogram(case):
    k, hist = case
    c = predicted_counters(hist, k)
    assert c.drafts == sum(hist) and c.draft_tokens == k * sum(hist)
    assert sum(c.per_pos) == c.accepted  # each accepted token is at one position
    assert all(c.per_pos[j] >= c.per_pos[j + 1] for j in range(k - 1))  # a chain accepts a prefix
    text = "".join(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{j}"}} {v}\n'
                   for j, v in enumerate(c.per_pos))
    text += (f"vllm:spec_decode_num_drafts_total {c.drafts}\nvllm:spec_decode_num_draft_tokens_total "
             f"{c.draft_tokens}\nvllm:spec_decode_num_accepted_tokens_total {c.accepted}\n")
    assert parse_spec_counters(text) == c
