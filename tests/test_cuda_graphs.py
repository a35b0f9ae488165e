"""make_graphed_callables: replay matches eager, static output, input and parameter checks (GPU), and the
sample_args checks that run before any CUDA work (CPU too)."""
import pytest
import torch

import sk
from numerics import rel_err
from sk.cuda_graphs import make_graphed_callables
from sk.nn import PreNormGEGLUFFN

gpu = pytest.mark.gpu


@pytest.mark.parametrize("sample_args, message", [
    ((), r"sample_args must hold at least one CUDA tensor, one per input of the module, e.g\. \(x,\); got an "
         r"empty sequence \(\)"),
    ([], r"sample_args must hold at least one CUDA tensor.*got an empty sequence"),
    (torch.zeros(4, 16), r"sample_args must be a sequence of CUDA tensors.*got a tensor of shape \(4, 16\) itself"),
    ((torch.zeros(4, 16),), r"sample_args\[0\] must be a CUDA tensor, got cpu"),
])
def test_sample_args_are_checked_before_any_cuda_work(sample_args, message):
    with pytest.raises(ValueError, match=rf"^make_graphed_callables: {message}"):
        make_graphed_callables(PreNormGEGLUFFN(16, 32), sample_args)


def graphed_block(m=1024, d=768, ff=1448):
    block = PreNormGEGLUFFN(d, ff).cuda().eval()
    sample = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        return block, make_graphed_callables(block, (sample,))


@gpu
@pytest.mark.parametrize("m,d,ff", [(1024, 768, 1448), (32, 2048, 16384), (7, 200, 520)])
def test_replay_matches_eager_for_new_inputs(m, d, ff):
    block, graphed = graphed_block(m, d, ff)
    with torch.inference_mode(), sk.coverage.strict():
        for _ in range(3):
            x = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
            # Same kernels in both, every reduction in a fixed order (the decode shape's split-K included).
            assert rel_err(graphed(x), block(x)) < 1e-3


@gpu
def test_output_is_static_and_overwritten_by_the_next_call():
    _, graphed = graphed_block()
    with torch.inference_mode():
        x1, x2 = (torch.randn(1024, 768, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        first = graphed(x1)
        saved = first.clone()
        second = graphed(x2)
        assert second is first and not torch.equal(saved, second)


@gpu
@pytest.mark.parametrize("bad,what", [
    (lambda: torch.randn(1000, 768, device="cuda", dtype=torch.bfloat16), "shape"),
    (lambda: torch.randn(1024, 768, device="cuda", dtype=torch.float16), "dtype"),
    (lambda: torch.randn(1024, 768, dtype=torch.bfloat16), "device"),
    (lambda: torch.randn(768, 1024, device="cuda", dtype=torch.bfloat16).t(), "strides"),
])
def test_mismatched_inputs_get_a_clear_error(bad, what):
    _, graphed = graphed_block()
    with torch.inference_mode(), pytest.raises(ValueError, match=f"input 0 has {what}"):
        graphed(bad())


@gpu
def test_changed_parameters_are_refused():
    block, graphed = graphed_block()
    with torch.no_grad():
        block.gate.weight.mul_(2)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="changed .* after capture"):
        graphed(torch.randn(1024, 768, device="cuda", dtype=torch.bfloat16))
