"""Training steps replayed from CUDA graphs (`sk_core/ops/_step_graphs.py`), through the GEGLU op that uses them:
replays give the eager path's bits, see in-place parameter updates, never overwrite what a caller holds, and
stand aside where they cannot be exact."""
import importlib

import pytest
import torch
import torch.utils.checkpoint

import sk
from numerics import KERNEL_DEVICE

geglu = importlib.import_module("sk.ops.gated_mlp.geglu")
step_graphs = importlib.import_module("sk.ops._step_graphs")
D, FF, M = 256, 392, 200  # small, not multiples of 128 (d_ff), a partial row tile


@pytest.fixture
def fresh_step_graphs(monkeypatch):
    """An empty capture cache for the op, so counts and slots belong to this test."""
    fresh = geglu.make_step_graphs()
    monkeypatch.setattr(geglu, "step_graphs", fresh)
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


def train(module, data, settings_override, *, replay):
    """SGD steps on `data`; returns each step's output, input grad and parameter grads."""
    settings_override(step_graphs=replay)
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
def test_gpu_replayed_training_steps_give_the_eager_bits_and_see_optimizer_updates(fresh_step_graphs, settings_override):
    data = batches(6)
    eager = train(make_module(), [(x.detach().clone().requires_grad_(), dy) for x, dy in data], settings_override,
                  replay=False)
    assert not fresh_step_graphs._slots
    sk.coverage.reset()
    module = make_module()  # kept: a freed parameter frees its signature's slots
    replayed = train(module, data, settings_override, replay=True)
    # Steps 3..6 replayed (after CAPTURE_AFTER eager ones), each after an SGD step changed every master in place.
    assert_same_bits(replayed, eager)
    assert all(torch.isfinite(t).all() for step in eager for t in step)
    # Two slots: the loop's `y` still holds the last step's graph while the next forward runs.
    assert [len(s) for s in fresh_step_graphs._slots.values()] == [2]
    assert sk.coverage.report()["kernel_calls"][geglu.OP] == 2 * len(data)  # a forward and a backward each


@pytest.mark.gpu
def test_gpu_two_forwards_before_one_backward_take_two_slots(fresh_step_graphs, settings_override):
    module = make_module()
    data = batches(3)
    train(module, data, settings_override, replay=True)  # captured on the third step
    (x1, dy1), (x2, dy2) = batches(2, seed=5)
    outputs = []
    for replay in (True, False):
        settings_override(step_graphs=replay)
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
def test_gpu_outputs_and_gradients_are_never_overwritten_by_later_replays(fresh_step_graphs, settings_override):
    module = make_module()
    settings_override(step_graphs=True)
    kept = []
    for x, dy in batches(6):
        y = module(x)
        grads = torch.autograd.grad(y, [x, *module.parameters()], dy)  # handed out directly, no accumulation
        kept.append([y.detach(), *grads] + [t.detach().clone() for t in (y, *grads)])
    assert fresh_step_graphs._slots
    for tensors in kept:
        half = len(tensors) // 2
        assert all(torch.equal(a, b) for a, b in zip(tensors[:half], tensors[half:]))


@pytest.mark.gpu
def test_gpu_backward_twice_with_retain_graph(fresh_step_graphs, settings_override):
    module = make_module()
    data = batches(4)
    train(module, data[:3], settings_override, replay=True)
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
def test_gpu_a_reassigned_parameter_is_a_new_signature(fresh_step_graphs, settings_override):
    module = make_module()
    data = batches(4)
    train(module, data[:3], settings_override, replay=True)
    module.gate.weight = torch.nn.Parameter(torch.randn_like(module.gate.weight) * D ** -0.5)
    x, dy = data[3]
    y = module(x)  # the captured graph reads the old tensor's memory: it must not be replayed
    settings_override(step_graphs=False)
    assert torch.equal(y, module(x))


@pytest.mark.gpu
def test_gpu_a_caller_capturing_its_own_graph_gets_the_kernels(fresh_step_graphs, settings_override):
    module = make_module()
    train(module, batches(3), settings_override, replay=True)
    settings_override(step_graphs=True)
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
    settings_override(step_graphs=False)
    assert torch.equal(static_y, module(x.requires_grad_()))  # the training forward, launched eagerly


@pytest.mark.gpu
def test_gpu_parameters_changed_between_forward_and_backward(fresh_step_graphs, settings_override):
    """Written in place after the forward: autograd raises, as for the eager call. Moved to other memory (as
    FSDP's resharding does): that backward runs eagerly and gives the eager bits."""
    module = make_module()
    data = batches(4)
    train(module, data[:3], settings_override, replay=True)
    x, dy = data[3]
    y = module(x)
    with torch.no_grad():
        module.up.weight.mul_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward(dy)
    grads = []
    for replay in (True, False):
        settings_override(step_graphs=replay)
        module.zero_grad(set_to_none=True)
        y = module(x)
        moved_from = module.down.weight.data_ptr()
        storage = module.down.weight.untyped_storage()
        storage.resize_(2 * storage.nbytes())  # a new allocation, the values copied over, the version unchanged
        assert module.down.weight.data_ptr() != moved_from
        y.backward(dy)
        grads.append([p.grad.clone() for p in module.parameters()])
    assert_same_bits([grads[0]], [grads[1]])


@pytest.mark.gpu
def test_gpu_activation_checkpointing_runs_the_op_eagerly(fresh_step_graphs, settings_override):
    """Under torch.utils.checkpoint (saved-tensor hooks) the op never replays: checkpointing decides what is kept,
    and its recomputation must see the same calls as the first pass."""
    module = make_module()
    data = batches(5)
    got = []
    for x, dy in data:
        x.grad = None
        torch.utils.checkpoint.checkpoint(module, x, use_reentrant=False).backward(dy)
        got.append(x.grad.clone())
    assert not fresh_step_graphs._slots
    settings_override(step_graphs=False)
    for (x, dy), g in zip(data, got):
        x.grad = None
        module(x).backward(dy)
        assert torch.equal(x.grad, g)


@pytest.mark.gpu
def test_gpu_large_steps_are_not_replayed(fresh_step_graphs, monkeypatch, settings_override):
    monkeypatch.setattr(geglu, "STEP_GRAPH_MAX_WORK", M * D * FF - 1)
    train(make_module(), batches(4), settings_override, replay=True)
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


def _ctx():
    return step_graphs._SavedContext((True, True, False))


def fake_step_graphs(monkeypatch, settings_override, fail=False):
    """StepGraphs over a stand-in op (y = 7, dx = 2·dy, dw = 3·dy) whose captures are stand-ins too (no GPU):
    what is left is the bookkeeping of signatures, slots, parameters and copies."""
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:2])

    def backward(ctx, grad):
        backward.eager_calls += 1
        return 2 * grad, 3 * grad, None
    backward.eager_calls = 0
    steps = step_graphs.StepGraphs("fake_op", None, setup_context, backward)
    for name, stand_in in (("is_current_stream_capturing", lambda: False), ("current_device", lambda: None),
                           ("current_stream", lambda: None)):  # CPU builds have no CUDA
        monkeypatch.setattr(torch.cuda, name, stand_in)
    settings_override(step_graphs=True)

    def capture(inputs, needs_input_grad):
        if fail:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (stand-in)")
        grads = (torch.full((3,), 2.0), torch.full((3,), 3.0), None)
        packs, layout = step_graphs._pack(grads)
        return step_graphs._Slot((inputs[0].clone(), None, inputs[2]), [1], (inputs[1].data_ptr(),),
                                 (torch.full((3,), 7.0),), torch.zeros(3), grads, packs, layout,
                                 _FakeGraph(), _FakeGraph())
    monkeypatch.setattr(steps, "_capture", capture)
    return steps, backward


def test_signatures_are_captured_after_repeated_eager_calls_and_slots_are_reused(monkeypatch, settings_override):
    steps, _ = fake_step_graphs(monkeypatch, settings_override)
    w = torch.randn(3)
    call = (torch.randn(3), w, 0.5)
    assert [steps.forward(_ctx(), call) for _ in range(step_graphs.CAPTURE_AFTER)] == [None, None]
    first = _ctx()
    y = steps.forward(first, call)
    slot = first.step_lease.slot
    assert torch.equal(y, torch.full((3,), 7.0)) and y.data_ptr() != slot.output[0].data_ptr()  # a copy
    assert first.saved_tensors[0] is w  # the parameters, for autograd's checks at backward
    second = _ctx()
    assert steps.forward(second, call) is not None  # the first slot is busy: a second one
    assert steps.forward(_ctx(), call) is None  # both busy, SLOTS reached: eagerly
    assert slot.forward_graph.replays == 1 and slot.backward_graph.replays == 0
    grads = steps.backward(first, torch.ones(3))
    assert slot.backward_graph.replays == 1
    assert torch.equal(grads[0], slot.grads[0]) and torch.equal(grads[1], slot.grads[1]) and grads[2] is None
    assert all(g.data_ptr() != b.data_ptr() for g, b in zip(grads[:2], slot.grads))  # copies, none a buffer
    del first  # autograd drops the ctx: its slot is free again
    again = _ctx()
    assert steps.forward(again, call) is not None and again.step_lease.slot is slot
    assert [len(s) for s in steps._slots.values()] == [2]
    # Another parameter tensor, another eps: other signatures, counted from zero.
    assert steps.forward(_ctx(), (torch.randn(3), torch.randn(3), 0.5)) is None
    assert steps.forward(_ctx(), (torch.randn(3), w, 0.25)) is None


def test_parameters_changed_between_forward_and_backward(monkeypatch, settings_override):
    steps, eager_backward = fake_step_graphs(monkeypatch, settings_override)
    w = torch.randn(3)
    call = (torch.randn(3), w, 0.5)
    for _ in range(step_graphs.CAPTURE_AFTER):
        steps.forward(_ctx(), call)
    # Moved to other memory without an in-place write (as FSDP's resharding does): that backward runs eagerly.
    ctx = _ctx()
    steps.forward(ctx, call)
    w.untyped_storage().resize_(2 * w.untyped_storage().nbytes())  # a new allocation, the values copied over
    assert torch.equal(steps.backward(ctx, torch.ones(3))[1], torch.full((3,), 3.0))
    assert eager_backward.eager_calls == 1
    assert steps.forward(_ctx(), call) is None  # at its new address it is another signature


def test_a_freed_parameter_frees_its_signatures_slots(monkeypatch, settings_override):
    steps, _ = fake_step_graphs(monkeypatch, settings_override)
    w = torch.randn(3)
    for _ in range(step_graphs.CAPTURE_AFTER + 1):
        steps.forward(_ctx(), (torch.randn(3), w, 0.5))
    assert len(steps._slots) == 1
    del w
    assert not steps._slots


def test_saved_tensor_hooks_and_another_device_run_eagerly(monkeypatch, settings_override):
    steps, _ = fake_step_graphs(monkeypatch, settings_override)
    call = (torch.randn(3), torch.randn(3), 0.5)
    for _ in range(step_graphs.CAPTURE_AFTER):
        steps.forward(_ctx(), call)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):  # checkpointing, save_on_cpu
        assert steps.forward(_ctx(), call) is None
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert steps.forward(_ctx(), call) is None
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    assert steps.forward(_ctx(), call) is not None


def test_a_failed_capture_warns_and_leaves_the_signature_eager(monkeypatch, settings_override):
    steps, _ = fake_step_graphs(monkeypatch, settings_override, fail=True)
    call = (torch.randn(3), torch.randn(3), 0.5)
    for _ in range(step_graphs.CAPTURE_AFTER):
        steps.forward(_ctx(), call)
    with pytest.warns(UserWarning, match="fake_op: capturing its training step .* out of memory"):
        assert steps.forward(_ctx(), call) is None
    assert steps.forward(_ctx(), call) is None  # no second attempt, no second warning
    assert not steps._slots  # and it holds no place among MAX_SIGNATURES


def test_signatures_beyond_the_limit_run_eagerly(monkeypatch, settings_override):
    steps, _ = fake_step_graphs(monkeypatch, settings_override)
    monkeypatch.setattr(step_graphs, "MAX_SIGNATURES", 2)
    calls = [(torch.randn(3), torch.randn(3), 0.5) for _ in range(3)]
    for call in calls:
        for _ in range(step_graphs.CAPTURE_AFTER):
            steps.forward(_ctx(), call)
    assert steps.forward(_ctx(), calls[0]) is not None and steps.forward(_ctx(), calls[1]) is not None
    assert steps.forward(_ctx(), calls[2]) is None
