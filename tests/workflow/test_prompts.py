"""The shipped prompt datasets: deterministic, exact token lengths, identical for every engine run."""
from sk.workflow import prompts
from sk.workflow.workloads import LLM


class ByteTokenizer:
    """Stands in for the engine's tokenizer: one token per byte, ids 0-2 special."""

    all_special_ids = [0, 1, 2]

    def encode(self, text):
        return [3 + b for b in text.encode()]

    def __len__(self):
        return 259


def test_throughput_requests_have_sampled_lengths_within_the_spec_and_are_reproducible():
    spec = LLM.mixed.spec
    first = prompts.throughput_requests(spec, 20, ByteTokenizer())
    again = prompts.throughput_requests(spec, 20, ByteTokenizer())
    assert first == again
    lengths = {len(r.prompt_token_ids) for r in first}
    assert len(lengths) > 1 and all(spec.input_len[0] <= n <= spec.input_len[1] for n in lengths)
    assert all(spec.output_len[0] <= r.max_tokens <= spec.decode_cap for r in first)


def test_long_documents_reach_their_length():
    spec = LLM.long_context.spec
    (request,) = prompts.throughput_requests(spec, 1, ByteTokenizer())
    assert spec.input_len[0] <= len(request.prompt_token_ids) <= spec.input_len[1]


def test_latency_batches_are_exact_and_avoid_special_tokens():
    spec = LLM.fixed_batch_32.spec
    batch = prompts.latency_requests(spec, ByteTokenizer())
    assert len(batch) == 32
    assert all(len(r.prompt_token_ids) == spec.input_len and r.max_tokens == spec.output_len for r in batch)
    assert all(t >= 3 for r in batch for t in r.prompt_token_ids)
    assert len({tuple(r.prompt_token_ids) for r in batch}) == 32
