"""Workloads: the regimes a model is exercised under, one per-family enum, the single source of truth.

A member's name is the token a scenario uses (`LLM.long_context`); its value is the name shown in outputs
(`long-context`). Every member must resolve to a throughput or a latency spec with its parameters: the family's
spec lists are joined to the enum by that value, and a member left without one fails here, at import, by name.

To add a workload: add the member to its family's enum, then a ThroughputWorkload or LatencyWorkload with
`name=` equal to the member's value to that family's list below, then check `sk list --workloads`.
"""
from __future__ import annotations

import dataclasses
import enum

from sk.workflow.errors import WorkflowError
from sk.workflow.prompts import DATASETS


class Purpose(str, enum.Enum):
    THROUGHPUT = "throughput"
    LATENCY = "latency"


class Workload(enum.Enum):
    """Base of the per-family enums."""

    @property
    def token(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    @property
    def spec(self) -> ThroughputWorkload | LatencyWorkload:
        return SPECS[self]


class LLM(Workload):
    mixed = "mixed"
    long_context = "long-context"
    decode_heavy = "decode-heavy"
    single_request = "single-request"
    fixed_batch_32 = "fixed-batch-32"
    # As the engines' own benchmarks: vLLM's benchmark_throughput / SGLang's bench_offline_throughput with fixed
    # lengths, and their latency benchmarks at a fixed batch.
    throughput = "throughput"
    decode_batch_1 = "decode-batch-1"
    decode_batch_8 = "decode-batch-8"
    decode_batch_32 = "decode-batch-32"
    decode_batch_64 = "decode-batch-64"
    # The decode phase of `throughput`'s batch (128 sequences) on its own.
    decode_batch_128 = "decode-batch-128"


@dataclasses.dataclass(frozen=True)
class ThroughputWorkload:
    """Many requests submitted at once; measured in generated tokens per second. Lengths are token ranges
    sampled per request (seeded), the output capped by `decode_cap`."""

    name: str
    num_requests: int
    dataset: str
    input_len: tuple[int, int]
    output_len: tuple[int, int]
    decode_cap: int
    purpose = Purpose.THROUGHPUT

    def parameters(self) -> str:
        return (f"requests={self.num_requests}, in={_span(self.input_len)}, out={_span(self.output_len)}, "
                f"decode_cap={self.decode_cap}")


@dataclasses.dataclass(frozen=True)
class LatencyWorkload:
    """One batch of identical-length requests, timed end to end `iterations` times after `warmup` runs."""

    name: str
    batch_size: int
    input_len: int
    output_len: int
    iterations: int = 5
    warmup: int = 1
    dataset: str = "random-tokens"
    purpose = Purpose.LATENCY

    def parameters(self) -> str:
        return (f"batch={self.batch_size}, in={self.input_len}, out={self.output_len}, "
                f"iterations={self.iterations} (+{self.warmup} warm-up)")


LLM_THROUGHPUT_WORKLOADS: list[ThroughputWorkload] = [
    ThroughputWorkload("mixed", num_requests=256, dataset="synthetic-chat", input_len=(16, 512),
                       output_len=(16, 256), decode_cap=256),
    ThroughputWorkload("long-context", num_requests=32, dataset="synthetic-documents", input_len=(1024, 2048),
                       output_len=(128, 128), decode_cap=128),
    ThroughputWorkload("decode-heavy", num_requests=64, dataset="synthetic-chat", input_len=(16, 64),
                       output_len=(256, 512), decode_cap=512),
    # 128 requests keep a full-depth 8B batch at seconds on an H200, so that paired rounds fit one device command.
    ThroughputWorkload("throughput", num_requests=128, dataset="random-tokens", input_len=(1024, 1024),
                       output_len=(128, 128), decode_cap=128),
]
LLM_LATENCY_WORKLOADS: list[LatencyWorkload] = [
    LatencyWorkload("single-request", batch_size=1, input_len=128, output_len=128),
    LatencyWorkload("fixed-batch-32", batch_size=32, input_len=128, output_len=128),
    *[LatencyWorkload(f"decode-batch-{b}", batch_size=b, input_len=32, output_len=128) for b in (1, 8, 32, 64, 128)],
]

# Family -> its specs. A new family adds its enum and its lists here.
_SPEC_SOURCES: dict[type[Workload], list[ThroughputWorkload | LatencyWorkload]] = {
    LLM: LLM_THROUGHPUT_WORKLOADS + LLM_LATENCY_WORKLOADS,
}


def _span(bounds: tuple[int, int]) -> str:
    low, high = bounds
    return str(low) if low == high else f"{low}-{high}"


def _build_workload_specs() -> dict[Workload, ThroughputWorkload | LatencyWorkload]:
    specs, problems = {}, []
    for family in Workload.__subclasses__():
        by_name = {spec.name: spec for spec in _SPEC_SOURCES.get(family, [])}
        for member in family:
            if member.value in by_name:
                specs[member] = by_name.pop(member.value)
            else:
                problems.append(f"{member.token} has no throughput/latency spec named {member.value!r}")
        problems += [f"{family.__name__} spec {name!r} matches no enum member" for name in by_name]
    for spec in specs.values():
        if spec.dataset not in DATASETS:
            problems.append(f"workload {spec.name!r} names unknown dataset {spec.dataset!r}")
    if problems:
        raise RuntimeError("Workloads missing a purpose/spec: " + "; ".join(problems))
    return specs


SPECS = _build_workload_specs()


def families() -> dict[str, type[Workload]]:
    return {family.__name__: family for family in Workload.__subclasses__()}


def resolve(token: str) -> Workload:
    """`"LLM.long_context"` -> LLM.long_context, or a WorkflowError listing the known tokens."""
    family_name, _, member_name = token.partition(".")
    family = families().get(family_name)
    if family is None or member_name not in family.__members__:
        known = ", ".join(member.token for member in SPECS)
        raise WorkflowError(f"unknown workload {token!r}; known: {known}")
    return family[member_name]
