"""Training steps replayed from CUDA graphs (`sk/ops/_step_graphs.py`), through the GEGLU op that uses them:
replays give the eager path's bits, see in-place parameter updates, never overwrite what a caller holds, and
stand aside where they cannot be exact."""
import importlib

import pytest
import torch

import sk
from numerics import KERNEL_DEVICE

geglu = importlib.import_module("sk.ops.fused_pre_norm_geglu")
step_graphs = importlib.import_module("sk.ops._step_graphs")
D, FF, M = 256, 392, 200  # small, not multiples of 128 (d_ff), a partial row tile


@pytest.fixture
def fresh_step_graphs(monkeypatch):
    """An empty capture cache for the op, so counts and slots belong to this test."""
    fresh = step_graphs.StepGraphs(geglu.OP, geglu._forward, geglu._setup_context, geglu._backward)
    monkeypatch.setattr(geglu, "_step_graphs", fresh)
    return fresh


def make_module(seed=0):
    torch.manual_seed(seed)
    module = sk.nn.PreNormGEGLUFFN(D, FF).cuda()
    with torch.no_grad():
        module.norm.weight.uniform_(0.5, 1.5)
        module.norm.bias.uniform_(-0.2, 0.2)
    return module


def batches(n, seed=1):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.randn(M, D, device="cuda", generator=gen).to(torch.bfloat16).requires_grad_(),
             torch.randn(M, D, device="cuda", generator=gen).to(torch.bfloat16)) for _ in range(n)]


def train(module, data, monkeypatch, *, replay):
    """SGD steps on `data`; returns each step's output, input grad and parameter grads."""
    monkeypatch.setattr(step_graphs, "ENABLED", replay)
    opt = torch.optim.SGD(module.parameters(), lr=1e-4)  # small enough that six steps stay finite
    seen = []
    for x, dy in data:
        x.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = module(x)
        y.backward(dy)
        seen.append([y.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in module.parameters()])
        opt.step()
        opt.zero_grad(set_to_none=True)
    return seen


def assert_same_bits(got, want):
    for step, (a, b) in enumerate(zip(got, want)):
        for i, (ta, tb) in enumerate(zip(a, b)):
            assert torch.equal(ta, tb), f"step {step}, tensor {i} differs"


@pytest.mark.gpu
def test_gpu_replayed_training_steps_give_the_eager_bits_and_see_optimizer_updates(fresh_step_graphs, monkeypatch):
    data = batches(6)
    eager = train(make_module(), [(x.detach().clone().requires_grad_(), dy) for x, dy in data], monkeypatch,
                  replay=False)
    assert not fresh_step_graphs._slots
    sk.coverage.reset()
    replayed = train(make_module(), data, monkeypatch, replay=True)
    # Steps 3..6 replayed (after CAPTURE_AFTER eager ones), each after an SGD step changed every master in place.
    assert_same_bits(replayed, eager)
    assert all(torch.isfinite(t).all() for step in eager for t in step)
    # Two slots: the loop's `y` still holds the last step's graph while the next forward runs.
    assert [len(s) for s in fresh_step_graphs._slots.values()] == [2]
    assert sk.coverage.report()["kernel_calls"][geglu.OP] == 2 * len(data)  # a forward and a backward each


@pytest.mark.gpu
def test_gpu_two_forwards_before_one_backward_take_two_slots(fresh_step_graphs, monkeypatch):
    module = make_module()
    data = batches(3)
    train(module, data, monkeypatch, replay=True)  # captured on the third step
    (x1, dy1), (x2, dy2) = batches(2, seed=5)
    outputs = []
    for replay in (True, False):
        monkeypatch.setattr(step_graphs, "ENABLED", replay)
        for x in (x1, x2):
            x.grad = None
        module.zero_grad(set_to_none=True)
        y1, y2 = module(x1), module(x2)
        y1_before = y1.detach().clone()
        ((y1.float() * dy1.float()).sum() + (y2.float() * dy2.float()).sum()).backward()
        assert torch.equal(y1, y1_before), "the second forward overwrote the first one's output"
        outputs.append([y1.detach(), y2.detach(), x1.grad, x2.grad] + [p.grad.clone() for p in module.parameters()])
        del y1, y2
    assert [len(s) for s in fresh_step_graphs._slots.values()] == [2]
    assert_same_bits([outputs[0]], [outputs[1]])


@pytest.mark.gpu
def test_gpu_outputs_and_input_grads_are_never_overwritten_by_later_replays(fresh_step_graphs, monkeypatch):
    module = make_module()
    monkeypatch.setattr(step_graphs, "ENABLED", True)
    kept = []
    for x, dy in batches(6):
        y = module(x)
        y.backward(dy)
        kept.append((y.detach(), y.detach().clone(), x.grad, x.grad.clone()))
    assert fresh_step_graphs._slots
    for y, y_copy, dx, dx_copy in kept:
        assert torch.equal(y, y_copy) and torch.equal(dx, dx_copy)


@pytest.mark.gpu
def test_gpu_backward_twice_with_retain_graph(fresh_step_graphs, monkeypatch):
    module = make_module()
    data = batches(4)
    train(module, data[:3], monkeypatch, replay=True)
    x, dy = data[3]
    module.zero_grad(set_to_none=True)
    y = module(x)
    y.backward(dy, retain_graph=True)
    once = [p.grad.clone() for p in module.parameters()]
    module(batches(1, seed=9)[0][0])  # another call in between: it must take the other slot
    y.backward(dy)
    for p, g in zip(module.parameters(), once):
        assert torch.equal(p.grad, 2 * g)


@pytest.mark.gpu
def test_gpu_a_reassigned_parameter_is_a_new_signature(fresh_step_graphs, monkeypatch):
    module = make_module()
    data = batches(4)
    train(module, data[:3], monkeypatch, replay=True)
    module.gate.weight = torch.nn.Parameter(torch.randn_like(module.gate.weight) * D ** -0.5)
    x, dy = data[3]
    y = module(x)  # the captured graph reads the old tensor's memory: it must not be replayed
    monkeypatch.setattr(step_graphs, "ENABLED", False)
    assert torch.equal(y, module(x))


@pytest.mark.gpu
def test_gpu_a_caller_capturing_its_own_graph_gets_the_kernels(fresh_step_graphs, monkeypatch):
    module = make_module()
    train(module, batches(3), monkeypatch, replay=True)
    monkeypatch.setattr(step_graphs, "ENABLED", True)
    x = batches(1, seed=3)[0][0].detach()
    static_x = x.clone().requires_grad_()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        module(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = module(static_x)
    graph.replay()
    monkeypatch.setattr(step_graphs, "ENABLED", False)
    assert torch.equal(static_y, module(x.requires_grad_()))  # the training forward, launched eagerly


@pytest.mark.gpu
def test_gpu_large_steps_are_not_replayed(fresh_step_graphs, monkeypatch):
    monkeypatch.setattr(geglu, "STEP_GRAPH_MAX_WORK", M * D * FF - 1)
    train(make_module(), batches(4), monkeypatch, replay=True)
    assert not fresh_step_graphs._slots


@pytest.mark.skipif(KERNEL_DEVICE == "cuda", reason="the CPU side of the rule")
def test_cpu_steps_are_never_captured(fresh_step_graphs):
    module = sk.nn.PreNormGEGLUFFN(16, 24)
    for _ in range(4):
        x = torch.randn(3, 16, requires_grad=True)
        module(x).sum().backward()
    assert not fresh_step_graphs._slots and not fresh_step_graphs._seen


# ----------------------------------------------------------------------------------------------- slot logic, any device

class _FakeGraph:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


class _Ctx:
    needs_input_grad = (True, True, False)


def fake_step_graphs(monkeypatch, fail=False):
    """StepGraphs whose captures are stand-ins (no GPU): what is left is the bookkeeping of signatures and slots."""
    steps = step_graphs.StepGraphs("fake_op", None, None, None)
    monkeypatch.setattr(step_graphs, "ENABLED", True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # CPU builds have no CUDA

    def capture(inputs, needs_input_grad):
        if fail:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (stand-in)")
        static = tuple(t.clone() if i == 0 else t for i, t in enumerate(inputs))
        return step_graphs._Slot(static, (torch.full((3,), 7.0),), None, torch.zeros(3),
                                 (torch.ones(3), torch.ones(3), None), _FakeGraph(), _FakeGraph())
    monkeypatch.setattr(steps, "_capture", capture)
    return steps


def test_signatures_are_captured_after_repeated_eager_calls_and_slots_are_reused(monkeypatch):
    steps = fake_step_graphs(monkeypatch)
    w = torch.randn(3)
    call = (torch.randn(3), w, 0.5)
    assert [steps.forward(_Ctx(), call) for _ in range(step_graphs.CAPTURE_AFTER)] == [None, None]
    first = _Ctx()
    y = steps.forward(first, call)
    slot = first.step_lease.slot
    assert torch.equal(y, torch.full((3,), 7.0)) and y.data_ptr() != slot.output[0].data_ptr()  # a copy
    second = _Ctx()
    assert steps.forward(second, call) is not None  # the first slot is busy: a second one
    assert steps.forward(_Ctx(), call) is None  # both busy, SLOTS reached: eagerly
    grads = steps.backward(first, torch.randn(3))
    assert grads[0].data_ptr() != first.step_lease.slot.grads[0].data_ptr()  # the activation's: a copy
    assert grads[1] is first.step_lease.slot.grads[1]  # a parameter's: for autograd's accumulation
    del first  # autograd drops the ctx: its slot is free again
    again = _Ctx()
    assert steps.forward(again, call) is not None
    assert [len(s) for s in steps._slots.values()] == [2]
    # Another parameter tensor, another eps: other signatures, counted from zero.
    assert steps.forward(_Ctx(), (torch.randn(3), torch.randn(3), 0.5)) is None
    assert steps.forward(_Ctx(), (torch.randn(3), w, 0.25)) is None


def test_a_failed_capture_warns_and_leaves_the_signature_eager(monkeypatch):
    steps = fake_step_graphs(monkeypatch, fail=True)
    call = (torch.randn(3), torch.randn(3), 0.5)
    for _ in range(step_graphs.CAPTURE_AFTER):
        steps.forward(_Ctx(), call)
    with pytest.warns(UserWarning, match="fake_op: capturing its training step .* out of memory"):
        assert steps.forward(_Ctx(), call) is None
    assert steps.forward(_Ctx(), call) is None  # no second attempt, no second warning


def test_signatures_beyond_the_limit_run_eagerly(monkeypatch):
    steps = fake_step_graphs(monkeypatch)
    monkeypatch.setattr(step_graphs, "MAX_SIGNATURES", 2)
    calls = [(torch.randn(3), torch.randn(3), 0.5) for _ in range(3)]
    for call in calls:
        for _ in range(step_graphs.CAPTURE_AFTER):
            steps.forward(_Ctx(), call)
    assert steps.forward(_Ctx(), calls[0]) is not None and steps.forward(_Ctx(), calls[1]) is not None
    assert steps.forward(_Ctx(), calls[2]) is None
