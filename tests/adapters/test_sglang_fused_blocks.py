"""SGLang's decoder-layer swap (sk.adapters.sglang.fused_blocks) at the layer level, without SGLang.

There is no SGLang on the CPU machines, so fakes stand in for it, shaped like SGLang 0.5.17's classes where the
swap reads them: `sglang.srt.models.llama` (LlamaMLP, LlamaDecoderLayer.forward(positions, hidden_states,
forward_batch, residual)), `sglang.srt.models.gemma2` (pre/post feed-forward GemmaRMSNorms around the MLP, tanh
GELU), `sglang.srt.models.qwen3` (norms run by a LayerCommunicator), the layers' attributes (RMSNorm options,
MergedColumnParallelLinear/RowParallelLinear with quant_method and tp_rank/tp_size/reduce_results), and a
HookRegistry with SGLang's AFTER semantics (`hook(result, *args, **kwargs)`, wrapper with `__wrapped__`).
Checked: built under the hooks, a layer's norm + MLP are one fused_gated_mlp call (its recorded reference on CPU)
returning what the stock layer returns; layouts and options the op does not cover keep SGLang's path with the
reason, an error naming the layer in strict mode; SK_FUSED_MLP=0 installs nothing; tensor-parallel shards;
Dynamo traces the fused layer whole. The real-SGLang layer checks are test_sglang_plugin.py (SGLang venv).
"""
import functools
import sys
import types

import pytest
import torch

import engine_stand_ins as stand_ins
import sk
from engine_stand_ins import (GemmaRMSNorm, MergedColumnParallelLinear, RMSNorm, RowParallelLinear, SiluAndMul,
                              UnquantizedLinearMethod)
from sk.adapters import fused_blocks


@pytest.fixture(autouse=True)
def _fused_blocks_on(settings_override):
    settings_override(fused_mlp=True)  # the default (SK_FUSED_MLP=1); the switch-off test overrides it back


D, FF = 32, 48
LLAMA, GEMMA2, QWEN3 = "sglang.srt.models.llama", "sglang.srt.models.gemma2", "sglang.srt.models.qwen3"


# ------------------------------------------------------------------------------- SGLang-shaped fakes

class HookType:
    AROUND, AFTER = "around", "after"


class HookRegistry:
    """SGLang's registry as the adapter uses it: register by dotted path, apply once per target."""
    _hooks: dict = {}
    _patched: set = set()

    @classmethod
    def register(cls, target, hook, kind):
        cls._hooks.setdefault(target, []).append((hook, kind))

    @classmethod
    def apply_hooks(cls):
        import functools

        for target, hooks in cls._hooks.items():
            if target in cls._patched:
                continue
            module, cls_name, attr = target.rsplit(".", 2)  # (the fakes' parents are not importable)
            owner = getattr(sys.modules[module], cls_name)
            original = getattr(owner, attr)
            (hook, kind), = hooks
            assert kind == HookType.AFTER

            @functools.wraps(original)
            def wrapper(*args, _original=original, _hook=hook, **kwargs):
                result = _original(*args, **kwargs)
                new = _hook(result, *args, **kwargs)
                return result if new is None else new

            setattr(owner, attr, wrapper)
            cls._patched.add(target)


class W8A8Int8LinearMethod:
    pass


class GeluAndMul(stand_ins.GeluAndMul):
    def __init__(self, approximate="tanh"):  # SGLang's default
        super().__init__(approximate)


class LlamaMLP(torch.nn.Module):
    __module__ = LLAMA

    def __init__(self, hidden_size, intermediate_size, tp_rank=0, tp_size=1, quant=UnquantizedLinearMethod,
                 act=None):
        super().__init__()
        f = intermediate_size // tp_size
        self.gate_up_proj = MergedColumnParallelLinear(2 * f, hidden_size, tp_rank, tp_size, quant)
        self.down_proj = RowParallelLinear(hidden_size, f, tp_rank, tp_size, quant)
        self.act_fn = act or SiluAndMul()

    def forward(self, x, forward_batch=None):
        gate_up, _ = self.gate_up_proj(x)
        x = self.act_fn(gate_up)
        x, _ = self.down_proj(x)
        return x

    def load_weights(self, weights):
        """SGLang's (weight loader v2): gate_proj and up_proj merged into gate_up_proj, the rest by name."""
        params, loaded = dict(self.named_parameters()), set()
        for name, tensor in weights:
            if name in ("gate_proj.weight", "up_proj.weight"):
                half = self.gate_up_proj.weight.shape[0] // 2
                start = 0 if name.startswith("gate") else half
                self.gate_up_proj.weight.data[start:start + half].copy_(tensor)
                loaded.add("gate_up_proj.weight")
            else:
                params[name].data.copy_(tensor)
                loaded.add(name)
        return loaded


class LlamaDecoderLayer(torch.nn.Module):
    __module__ = LLAMA

    def __init__(self, config=None, layer_id=0, quant_config=None, prefix="", tp_rank=0, tp_size=1,
                 quant=UnquantizedLinearMethod, norm_options=None):
        super().__init__()
        torch.manual_seed(layer_id)
        self.self_attn = torch.nn.Identity()  # the attention half is not what is swapped
        self.mlp = LlamaMLP(D, FF, tp_rank, tp_size, quant)
        self.input_layernorm = RMSNorm(D)
        self.post_attention_layernorm = RMSNorm(D, **(norm_options or {}))

    def forward(self, positions, hidden_states, forward_batch, residual):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(hidden_states)

        # Fully Connected
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        hidden_states = self.mlp(hidden_states)
        return hidden_states, residual


class Gemma2MLP(LlamaMLP):
    __module__ = GEMMA2


class Gemma2DecoderLayer(torch.nn.Module):
    __module__ = GEMMA2

    def __init__(self, layer_id=0, config=None, quant_config=None, prefix=""):
        super().__init__()
        torch.manual_seed(layer_id)
        self.mlp = Gemma2MLP(D, FF, act=GeluAndMul("tanh"))
        self.input_layernorm = GemmaRMSNorm(D)
        self.post_attention_layernorm = GemmaRMSNorm(D)
        self.pre_feedforward_layernorm = GemmaRMSNorm(D)
        self.post_feedforward_layernorm = GemmaRMSNorm(D)

    def forward(self, positions, hidden_states, residual, forward_batch):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.post_attention_layernorm(hidden_states)

        hidden_states, residual = self.pre_feedforward_layernorm(hidden_states, residual)
        hidden_states = self.mlp(hidden_states)
        hidden_states = self.post_feedforward_layernorm(hidden_states)
        return hidden_states, residual


class CommunicateWithAllReduceAndLayerNormFn:  # SGLang's names: the plain path and a communicating one
    @staticmethod
    def _simple(hidden_states, residual, forward_batch, layernorm, context):
        if hidden_states.shape[0] != 0:
            hidden_states, residual = layernorm(hidden_states, residual)
        return hidden_states, residual

    @staticmethod
    def _gather_hidden_states_and_residual(hidden_states, residual, forward_batch, layernorm, context,
                                           residual_input_mode=None):
        raise AssertionError("a communicating mode is not run here")


class CommunicateSummableTensorPairFn:
    @staticmethod
    def _trivial(hidden_states, residual, forward_batch, context):
        return hidden_states, residual


class LayerCommunicator:
    """SGLang's, as the MLP half of a Qwen3 layer uses it: prepare_mlp calls the communicator's own norm."""

    def __init__(self, input_layernorm, post_attention_layernorm, communicating=False):
        self.input_layernorm, self.post_attention_layernorm = input_layernorm, post_attention_layernorm
        self._communicate_with_all_reduce_and_layer_norm_fn = (
            functools.partial(CommunicateWithAllReduceAndLayerNormFn._gather_hidden_states_and_residual,
                              residual_input_mode="scattered")
            if communicating else CommunicateWithAllReduceAndLayerNormFn._simple)
        self._communicate_summable_tensor_pair_fn = CommunicateSummableTensorPairFn._trivial

    def prepare_mlp(self, hidden_states, residual, forward_batch, cache=None):
        return self._communicate_with_all_reduce_and_layer_norm_fn(
            hidden_states=hidden_states, residual=residual, forward_batch=forward_batch,
            layernorm=self.post_attention_layernorm, context=None)

    def postprocess_layer(self, hidden_states, residual, forward_batch):
        return self._communicate_summable_tensor_pair_fn(hidden_states=hidden_states, residual=residual,
                                                         forward_batch=forward_batch, context=None)


class Qwen3DecoderLayer(torch.nn.Module):
    __module__ = QWEN3

    def __init__(self, config=None, layer_id=0, quant_config=None, prefix="", communicating=False):
        super().__init__()
        torch.manual_seed(layer_id)
        self.mlp = LlamaMLP(D, FF)
        self.input_layernorm = RMSNorm(D)
        self.post_attention_layernorm = RMSNorm(D)
        self.layer_communicator = LayerCommunicator(self.input_layernorm, self.post_attention_layernorm,
                                                    communicating)

    def forward(self, positions, hidden_states, forward_batch, residual, post_residual_addition=None):
        # (the attention half, through prepare_attn, is not what is swapped)
        # Fully Connected
        hidden_states, residual = self.layer_communicator.prepare_mlp(
            hidden_states,
            residual,
            forward_batch,
            cache=None,
        )
        hidden_states = self.mlp(hidden_states, forward_batch=forward_batch)
        hidden_states, residual = self.layer_communicator.postprocess_layer(hidden_states, residual, forward_batch)
        return hidden_states, residual


def _modules() -> dict[str, types.ModuleType]:
    found = {}
    for name, classes in {LLAMA: [LlamaMLP, LlamaDecoderLayer], GEMMA2: [Gemma2MLP, Gemma2DecoderLayer],
                          QWEN3: [Qwen3DecoderLayer]}.items():
        module = types.ModuleType(name)
        for cls in classes:
            setattr(module, cls.__name__, cls)
        found[name] = module
    registry = types.ModuleType("sglang.srt.plugins.hook_registry")
    registry.HookRegistry, registry.HookType = HookRegistry, HookType
    found[registry.__name__] = registry
    distributed = types.ModuleType("sglang.srt.distributed")
    distributed.tensor_model_parallel_all_reduce = lambda t: pytest.fail("no all-reduce at tp=1")
    found[distributed.__name__] = distributed
    return found


@pytest.fixture
def sglang(monkeypatch):
    """The fakes importable under SGLang's module names, the hooks applied (and undone afterwards)."""
    from sk.adapters.sglang import fused_blocks as sglang_blocks

    inits = {cls: cls.__init__ for cls in (LlamaDecoderLayer, Gemma2DecoderLayer, Qwen3DecoderLayer)}
    for name, module in _modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(HookRegistry, "_hooks", {})
    monkeypatch.setattr(HookRegistry, "_patched", set())
    monkeypatch.setattr(sglang_blocks, "BLOCKS", fused_blocks.FusedBlocks())
    monkeypatch.setattr(sglang_blocks, "_built", [])
    sk.coverage.reset()

    def apply():
        installed = sglang_blocks.hooks()
        for target, (hook, _) in installed.items():
            HookRegistry.register(target, hook, HookType.AFTER)
        HookRegistry.apply_hooks()
        return installed

    yield types.SimpleNamespace(apply=apply, blocks=lambda: sglang_blocks.BLOCKS, module=sglang_blocks)
    for cls, init in inits.items():
        cls.__init__ = init


# ------------------------------------------------------------------------------------------------ checks

def test_layers_built_under_the_hooks_are_fused_and_answer_as_stock(sglang):
    stock_llama, stock_gemma = LlamaDecoderLayer(layer_id=3), Gemma2DecoderLayer(layer_id=4)
    stock_qwen3 = Qwen3DecoderLayer(layer_id=0)
    installed = sglang.apply()
    assert set(installed) == {f"{LLAMA}.LlamaDecoderLayer.__init__", f"{GEMMA2}.Gemma2DecoderLayer.__init__",
                              f"{QWEN3}.Qwen3DecoderLayer.__init__"}
    assert LlamaDecoderLayer.__init__.__wrapped__ is not None
    llama = LlamaDecoderLayer(layer_id=3, prefix="model.layers.3")
    gemma = Gemma2DecoderLayer(layer_id=4, prefix="model.layers.4")
    qwen3 = Qwen3DecoderLayer(layer_id=0, prefix="model.layers.0")
    communicating = Qwen3DecoderLayer(layer_id=1, prefix="model.layers.1", communicating=True)
    blocks = sglang.blocks()
    assert blocks.fused == {
        "model.layers.3": "LlamaDecoderLayer: post_attention_layernorm + mlp, norm=rms, activation=silu",
        "model.layers.4": "Gemma2DecoderLayer: pre_feedforward_layernorm + mlp, norm=gemma_rms, activation=gelu_tanh",
        "model.layers.0": "Qwen3DecoderLayer: post_attention_layernorm + mlp, norm=rms, activation=silu",
    }
    assert blocks.engine_path == {"model.layers.1": (
        "Qwen3DecoderLayer: SGLang's LayerCommunicator communicates around the norm here (attention tensor/data "
        "parallelism, all-reduce fusion or scattered residuals: "
        "CommunicateWithAllReduceAndLayerNormFn._gather_hidden_states_and_residual, "
        "CommunicateSummableTensorPairFn._trivial); only its plain path is fused")}
    assert not isinstance(communicating.mlp, fused_blocks.MlpComputedByNorm)
    assert qwen3.layer_communicator.post_attention_layernorm is qwen3.post_attention_layernorm
    assert [n for n, _ in llama.named_parameters()] == [n for n, _ in stock_llama.named_parameters()]
    x, residual = torch.randn(5, D), torch.randn(5, D)
    for stock, fused, args in ((stock_llama, llama, lambda r: (None, x, None, r)),
                               (stock_gemma, gemma, lambda r: (None, x, r, None)),
                               (stock_qwen3, qwen3, lambda r: (None, x, None, x if r is None else r))):
        for r in (residual, None):  # the first layer gets no residual
            expected, got = stock(*args(r)), fused(*args(r))
            torch.testing.assert_close(got, expected)
    report = blocks.report()
    assert report["layers_fused"] == 3
    assert report["weights_prepared"] == {}, report  # no weight copies: SGLang's memory pools are stock's size
    if sk.settings.get("triton_interpret"):  # fp32 on CPU: the kernels, interpreted, on the layers' own weights
        assert report["fallback_calls"] == 0
        assert report["kernel_calls"] == {"fused_gated_mlp/rms": 4, "fused_gated_mlp/gemma_rms": 2}, report
    else:
        assert report["fallback_calls"] == 6
        assert {f["op"] for f in sk.coverage.report()["fallbacks"]} >= {"fused_gated_mlp/rms",
                                                                        "fused_gated_mlp/gemma_rms"}
    assert sglang.module.summary(installed).startswith(fused_blocks.WHAT)



def test_options_the_op_does_not_cover_keep_sglangs_path(sglang):
    sglang.apply()
    LlamaDecoderLayer(prefix="model.layers.0", quant=W8A8Int8LinearMethod)
    LlamaDecoderLayer(prefix="model.layers.1", norm_options={"fp32_residual": True})
    LlamaDecoderLayer(prefix="model.layers.2", norm_options={"var_hidden_size": 16})
    assert sglang.blocks().engine_path == {
        "model.layers.0": "LlamaDecoderLayer: gate_up_proj is quantized (W8A8Int8LinearMethod)",
        "model.layers.1": "LlamaDecoderLayer: post_attention_layernorm: fp32 residual (fp32_residual)",
        "model.layers.2": "LlamaDecoderLayer: post_attention_layernorm: variance over part of the hidden size "
                          "(var_hidden_size)",
    }
    assert sglang.blocks().fused == {}


def test_strict_mode_makes_an_uncovered_layer_an_error_naming_it(sglang):
    sglang.apply()
    with sk.coverage.strict(), pytest.raises(fused_blocks.UncoveredLayerError,
                                             match=r"decoder layer model\.layers\.7 \(LlamaDecoderLayer\) keeps "
                                                   r"SGLang's own norm \+ MLP.*quantized"):
        LlamaDecoderLayer(prefix="model.layers.7", quant=W8A8Int8LinearMethod)


def test_switch_off_installs_no_hook(sglang):
    with sk.settings.override(fused_mlp=False):
        installed = sglang.apply()
    assert installed == {} and sglang.module.summary(installed) == "off (SK_FUSED_MLP=0)"
    assert not isinstance(LlamaDecoderLayer().mlp, fused_blocks.MlpComputedByNorm)
    assert sglang.blocks().report()["enabled"] is False


class LlamaAttention(torch.nn.Module):
    """The projections of SGLang's LlamaAttention (QKVParallelLinear, RowParallelLinear: forward through
    quant_method.apply); the attention itself is the query slice here."""

    def __init__(self, quant=UnquantizedLinearMethod):
        super().__init__()
        self.qkv_proj = stand_ins.QKVParallelLinear(3 * D, D, quant=quant)
        self.o_proj = stand_ins.QKVParallelLinear(D, D, quant=quant)

    def forward(self, x):
        qkv, _ = self.qkv_proj(x)
        return self.o_proj(qkv[..., :D])[0]


def test_attention_projections_are_routed_at_construction_with_the_fused_blocks_on_or_off(sglang, monkeypatch):
    monkeypatch.setattr(LlamaDecoderLayer, "__init__", _with_attention(LlamaDecoderLayer.__init__))
    stock = LlamaDecoderLayer(layer_id=2)
    with sk.settings.override(fused_mlp=False, attention_linear=True):
        installed = sglang.apply()
        layer = LlamaDecoderLayer(layer_id=2, prefix="model.layers.2")
        quantized = LlamaDecoderLayer(layer_id=3, prefix="model.layers.3", quant=W8A8Int8LinearMethod)
        assert sglang.module.summary(installed) == "off (SK_FUSED_MLP=0); QKV and output projections -> sk.ops.linear"
    blocks = sglang.blocks()
    assert blocks.fused == {} and sorted(blocks.projections) == ["model.layers.2.self_attn.o_proj",
                                                                 "model.layers.2.self_attn.qkv_proj"]
    assert blocks.projections_engine_path["model.layers.3.self_attn.qkv_proj"] == \
        "qkv_proj is quantized (W8A8Int8LinearMethod)"
    assert not isinstance(quantized.mlp, fused_blocks.MlpComputedByNorm)
    x, residual = torch.randn(5, D), torch.randn(5, D)
    sk.coverage.reset()
    torch.testing.assert_close(layer(None, x, None, residual), stock(None, x, None, residual))
    assert blocks.report()["projections"]["fallback_calls"] == 2  # qkv and o through sk.ops.linear (fp32: reference)


def _with_attention(init):
    def with_attention(self, *args, quant=UnquantizedLinearMethod, **kwargs):
        init(self, *args, quant=quant, **kwargs)
        self.self_attn = LlamaAttention(quant)
    return with_attention


@pytest.mark.parametrize("tp", [2, 4])
def test_shards_reduced_by_sglang_equal_the_unsharded_block(sglang, tp):
    full = LlamaDecoderLayer(layer_id=1)
    sglang.apply()
    x, residual = torch.randn(6, D), torch.randn(6, D)
    expected_out, expected_h = full(None, x, None, residual)
    gate, up = full.mlp.gate_up_proj.weight.data.chunk(2)
    down = full.mlp.down_proj.weight.data
    f, partials, reduced = FF // tp, [], []
    for rank in range(tp):
        layer = LlamaDecoderLayer(layer_id=1, tp_rank=rank, tp_size=tp)
        layer.mlp.gate_up_proj.weight.data = torch.cat([gate[rank * f:(rank + 1) * f], up[rank * f:(rank + 1) * f]])
        layer.mlp.down_proj.weight.data = down[:, rank * f:(rank + 1) * f]  # loaded after construction
        for norm in ("input_layernorm", "post_attention_layernorm"):
            getattr(layer, norm).weight.data = getattr(full, norm).weight.data
        layer.post_attention_layernorm.__dict__["sk_all_reduce"] = lambda t: reduced.append(rank) or t
        assert layer.post_attention_layernorm.sk_plan.reduce
        out, h = layer(None, x, None, residual)
        torch.testing.assert_close(h, expected_h)
        partials.append(out)
    assert reduced == list(range(tp))
    torch.testing.assert_close(sum(partials), expected_out)


def test_dynamo_traces_the_fused_layer_whole(sglang):
    sglang.apply()
    layer = Gemma2DecoderLayer(prefix="model.layers.0")
    x, residual = torch.randn(4, D), torch.randn(4, D)
    eager = layer(None, x, residual, None)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")(None, x, residual, None)
    torch.testing.assert_close(compiled, eager)


def test_a_forward_of_another_layout_keeps_sglangs_path(sglang):
    class Reordered(LlamaDecoderLayer):  # a Llama layer whose forward runs the MLP before its norm
        def forward(self, positions, hidden_states, forward_batch, residual):
            hidden_states = self.mlp(hidden_states)
            hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
            return hidden_states, residual
    Reordered.__name__, Reordered.__module__ = "LlamaDecoderLayer", LLAMA  # as another SGLang's class would be
    blocks = sglang.module.fuse_layer(Reordered(), "post_attention_layernorm", "model.layers.7",
                                      blocks=fused_blocks.FusedBlocks())
    assert blocks.engine_path == {"model.layers.7": (
        "LlamaDecoderLayer: LlamaDecoderLayer.forward does not call post_attention_layernorm(hidden_states, "
        "residual) (or layer_communicator.prepare_mlp) then mlp(hidden_states) (the layouts the fused block was "
        "written for)")}


def test_a_subclass_from_another_model_is_left_alone(sglang):
    # SGLang's EAGLE-3 draft layer subclasses LlamaDecoderLayer (same name, its own module) and replaces its MLP
    # after the base __init__, where the hook runs: fusing there would run an MLP twice. Only the listed classes
    # themselves are fused.
    class DraftLayer(LlamaDecoderLayer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.mlp = LlamaMLP(D, FF)
    DraftLayer.__name__, DraftLayer.__module__ = "LlamaDecoderLayer", "sglang.srt.models.llama_eagle3"
    sglang.apply()
    draft = DraftLayer(layer_id=0, prefix="model.layers.0")
    assert not isinstance(draft.post_attention_layernorm, fused_blocks.FusedNormMLP)
    assert sglang.blocks().fused == {} and sglang.blocks().engine_path == {}


def test_the_loaded_model_reports_subclasses_on_sglangs_path_and_forgets_layers_it_dropped(sglang):
    # Ministral3's model builds Llama layers through the base __init__ (fused there), then replaces them with its
    # own subclass: the report must name the layers that run, not the ones dropped.
    class Ministral3DecoderLayer(LlamaDecoderLayer):
        pass
    Ministral3DecoderLayer.__module__ = "sglang.srt.models.ministral3"
    sglang.apply()
    blocks = sglang.blocks()
    dropped = LlamaDecoderLayer(layer_id=0, prefix="model.layers.0")
    assert "model.layers.0" in blocks.fused
    del dropped
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([Ministral3DecoderLayer(layer_id=0, prefix="model.layers.0")])
    assert sglang.module.check_loaded_model(model, blocks) == 0
    assert blocks.fused == {}
    assert blocks.engine_path == {"layers.0": (
        "Ministral3DecoderLayer: a subclass of LlamaDecoderLayer from sglang.srt.models.ministral3; only the listed "
        "classes themselves are fused (a subclass may change the MLP or the forward)")}
    with sk.coverage.strict(), pytest.raises(fused_blocks.UncoveredLayerError, match=r"layers\.0 \(Ministral3"):
        sglang.module.check_loaded_model(model, blocks)


def test_the_mlp_stand_in_loads_weights_as_sglangs_mlp_does(sglang):
    # SGLang's weight loader v2 asks each module with a load_weights to load its own (LlamaMLP merges gate_proj
    # and up_proj): the stand-in keeps that method, on the same parameters.
    sglang.apply()
    layer = LlamaDecoderLayer(layer_id=3, prefix="model.layers.3")
    assert isinstance(layer.mlp, fused_blocks.MlpComputedByNorm)
    gate, up = torch.randn(FF, D), torch.randn(FF, D)
    assert layer.mlp.load_weights([("gate_proj.weight", gate), ("up_proj.weight", up)]) == {"gate_up_proj.weight"}
    assert torch.equal(layer.mlp.gate_up_proj.weight, torch.cat([gate, up]))
    plain = type("PlainMLP", (torch.nn.Module,), {})  # an MLP without one gets a stand-in without one
    assert not hasattr(fused_blocks.stand_in_class(plain), "load_weights")


def test_projections_repacked_at_load_go_back_to_sglangs_path(sglang):
    # SGLang on a CPU with AMX packs the linears' weights after loading; the op reads plain weights, so such a
    # layer gets its own norm and MLP back, recorded (an error under strict mode).
    stock = LlamaDecoderLayer(layer_id=3)
    sglang.apply()
    packed = LlamaDecoderLayer(layer_id=3, prefix="model.layers.3")
    plain = Qwen3DecoderLayer(layer_id=0, prefix="model.layers.0")
    packed.mlp.gate_up_proj.use_intel_amx_backend = True
    blocks = sglang.blocks()
    assert sglang.module.check_loaded_model(torch.nn.ModuleList([packed, plain]), blocks) == 1
    assert not isinstance(packed.mlp, fused_blocks.MlpComputedByNorm) and type(packed.mlp).__name__ == "LlamaMLP"
    assert type(packed.post_attention_layernorm) is RMSNorm
    assert list(blocks.fused) == ["model.layers.0"]
    assert blocks.engine_path == {"model.layers.3": (
        "LlamaDecoderLayer: the engine packed gate_up_proj's weight for its CPU backend (AMX) after loading; the op "
        "reads plain weights")}
    assert [n for n, _ in packed.named_parameters()] == [n for n, _ in stock.named_parameters()]
    x, residual = torch.randn(5, D), torch.randn(5, D)
    torch.testing.assert_close(packed(None, x, None, residual), stock(None, x, None, residual))
    again = LlamaDecoderLayer(layer_id=3, prefix="model.layers.5")
    again.mlp.down_proj.use_intel_amx_backend = True
    with sk.coverage.strict(), pytest.raises(fused_blocks.UncoveredLayerError, match=r"model\.layers\.5 .*AMX"):
        sglang.module.check_loaded_model(again, blocks)


def test_lora_and_deterministic_inference_keep_sglangs_path(sglang, monkeypatch):
    server_args = types.ModuleType("sglang.srt.server_args")
    monkeypatch.setitem(sys.modules, server_args.__name__, server_args)
    sglang.apply()
    for args, reason in ((dict(enable_lora=True), "LoRA is enabled"),
                         (dict(lora_paths=["adapter"]), "LoRA is enabled"),
                         (dict(torchao_config="int8wo"), "torchao quantization (--torchao-config int8wo"),
                         (dict(enable_deterministic_inference=True), "deterministic inference")):
        server_args.get_global_server_args = lambda args=args: types.SimpleNamespace(**args)
        layer = LlamaDecoderLayer(layer_id=1, prefix=f"model.layers.{reason}")
        assert not isinstance(layer.mlp, fused_blocks.MlpComputedByNorm)
        assert reason in sglang.blocks().engine_path[f"model.layers.{reason}"]

    def not_set():
        raise ValueError("Global server args is not set yet!")
    server_args.get_global_server_args = not_set  # a layer built outside a server: planned as usual
    assert isinstance(LlamaDecoderLayer(layer_id=1, prefix="model.layers.9").mlp, fused_blocks.MlpComputedByNorm)


def _normalized_like_sglang(targets):  # sglang.srt.lora.utils.get_normalized_target_modules, in short
    if isinstance(targets, str):
        return {"all"}
    names = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
             "up_proj": "gate_up_proj"}
    return {names.get(t.split(".")[-1], t.split(".")[-1]) for t in targets}


@pytest.mark.parametrize("targets, mlp_fused, attention_routed", [
    ({"q_proj", "v_proj"}, True, False),
    ({"model.layers.0.mlp.down_proj"}, False, True),
    ({"o_proj"}, True, False),
    ({"all"}, False, False),
    (None, False, False),
])
def test_lora_keeps_sglangs_path_only_on_the_modules_it_targets(sglang, monkeypatch, targets, mlp_fused,
                                                                attention_routed):
    server_args = types.ModuleType("sglang.srt.server_args")
    lora_utils = types.ModuleType("sglang.srt.lora.utils")
    lora_utils.get_normalized_target_modules = _normalized_like_sglang
    monkeypatch.setitem(sys.modules, server_args.__name__, server_args)
    monkeypatch.setitem(sys.modules, lora_utils.__name__, lora_utils)
    server_args.get_global_server_args = lambda: types.SimpleNamespace(enable_lora=True, lora_target_modules=targets)
    monkeypatch.setattr(LlamaDecoderLayer, "__init__", _with_attention(LlamaDecoderLayer.__init__))
    with sk.settings.override(attention_linear=True):
        sglang.apply()
        layer = LlamaDecoderLayer(layer_id=1, prefix="model.layers.1")
    blocks = sglang.blocks()
    assert isinstance(layer.mlp, fused_blocks.MlpComputedByNorm) is mlp_fused
    assert ("model.layers.1.self_attn.qkv_proj" in blocks.projections) is attention_routed
    if not mlp_fused:
        assert "LoRA" in blocks.engine_path["model.layers.1"]
    if not attention_routed:
        reason = blocks.projections_engine_path["model.layers.1.self_attn.qkv_proj"]
        assert ("LoRA targets qkv_proj, o_proj" in reason if targets == {"all"} else "LoRA" in reason)
    if targets is None:
        assert "--lora-target-modules" in blocks.engine_path["model.layers.1"]


def test_weights_sglangs_updates_write_are_the_ones_the_block_computes_with(sglang):
    # SGLang's online weight updates write through .data, name by name, while its CUDA graphs stay captured: the
    # op reads the Parameters themselves, so nothing has to follow the writes.
    stock = LlamaDecoderLayer(layer_id=3)
    sglang.apply()
    layer = LlamaDecoderLayer(layer_id=3, prefix="model.layers.3")
    model = torch.nn.ModuleList([layer])
    sglang.module.after_load_model(None, types.SimpleNamespace(model=model))
    torch.manual_seed(7)
    new = {n: torch.randn_like(p) * p.detach().std() + p.detach().mean() for n, p in stock.named_parameters()}
    for n, p in stock.named_parameters():
        p.data.copy_(new[n])
    params = dict(model.named_parameters())
    for name, tensor in new.items():
        params[f"0.{name}"].data.copy_(tensor)
    x, residual = torch.randn(5, D), torch.randn(5, D)
    torch.testing.assert_close(layer(None, x, None, residual), stock(None, x, None, residual))
    assert sk.coverage.report()["weights_prepared"] == {}
