"""Workloads: every member resolves to a purpose with parameters; a member without one fails loudly, by name."""
import pytest

from sk.workflow import workloads
from sk.workflow.errors import WorkflowError
from sk.workflow.workloads import LLM, LatencyWorkload, Purpose, ThroughputWorkload


def test_every_member_has_a_spec_named_after_its_value():
    for member in LLM:
        assert member.spec.name == member.value
        assert member.spec.purpose in (Purpose.THROUGHPUT, Purpose.LATENCY)
    assert LLM.mixed.spec.purpose is Purpose.THROUGHPUT
    assert LLM.fixed_batch_32.spec.batch_size == 32


def test_tokens_resolve_and_unknown_tokens_are_refused():
    assert workloads.resolve("LLM.long_context") is LLM.long_context
    assert LLM.long_context.token == "LLM.long_context"
    with pytest.raises(WorkflowError, match="unknown workload 'LLM.nope'.*LLM.mixed"):
        workloads.resolve("LLM.nope")


def test_a_member_without_a_spec_fails_at_build_naming_it(monkeypatch):
    class Toy(workloads.Workload):
        covered = "covered"
        forgotten = "forgotten"

    monkeypatch.setitem(workloads._SPEC_SOURCES, Toy, [LatencyWorkload("covered", batch_size=1, input_len=8,
                                                                        output_len=8)])
    with pytest.raises(RuntimeError, match=r"missing a purpose/spec: Toy\.forgotten"):
        workloads._build_workload_specs()


def test_a_spec_naming_an_unknown_dataset_fails(monkeypatch):
    bad = ThroughputWorkload("mixed", num_requests=1, dataset="nowhere", input_len=(1, 1), output_len=(1, 1),
                             decode_cap=1)
    sources = [bad if s.name == "mixed" else s for s in workloads._SPEC_SOURCES[LLM]]
    monkeypatch.setitem(workloads._SPEC_SOURCES, LLM, sources)
    with pytest.raises(RuntimeError, match="unknown dataset 'nowhere'"):
        workloads._build_workload_specs()
