"""The decoder-layer fused blocks (sk.adapters.fused_blocks, sk.adapters.vllm.fused_blocks) without an engine.

Stand-ins shaped like vLLM's classes (the attributes the plan reads: MergedColumnParallelLinear/RowParallelLinear
with quant_method, tp_rank/tp_size, reduce_results; RMSNorm/GemmaRMSNorm; SiluAndMul/GeluAndMul; the decoder
layer's forward) run in fp32 on CPU, where the op runs its recorded reference, or its kernels under Triton's
interpreter (the coverage table's interpreted_precisions; CI's default). Checked: the swapped layer returns
what the stock layer returns (with and without a residual, gemma and llama forms); tensor-parallel shards (the
partial products of each rank, summed as the engine's all-reduce sums them, bias on rank 0 only) equal the
unsharded block; what the op does not cover keeps the engine path with the reason, and is an error naming the
layer in strict mode; parameter names are kept; Dynamo traces the swapped layer whole.
In-engine checks: test_vllm_parity.py (tokens equal stock, report counts), test_vllm_strict.py.
"""
import gc
import types

import pytest
import torch

import sk
from engine_stand_ins import (GeluAndMul, GemmaRMSNorm, MergedColumnParallelLinear, QKVParallelLinear, RMSNorm,
                              RowParallelLinear, SiluAndMul, UnquantizedLinearMethod)
from sk.adapters import fused_blocks
from sk.adapters.vllm import fused_blocks as vllm_blocks


@pytest.fixture(autouse=True)
def _fused_blocks_on(settings_override):
    settings_override(fused_mlp=True)  # the default (SK_FUSED_MLP=1); the switch-off test overrides it back


D, FF = 32, 48
INTERPRETED = sk.settings.get("triton_interpret")


class Fp8LinearMethod:
    pass


class LlamaMLP(torch.nn.Module):
    def __init__(self, gate_up, down, act):
        super().__init__()
        self.gate_up_proj, self.down_proj, self.act_fn = gate_up, down, act

    def forward(self, x):
        x, _ = self.gate_up_proj(x)
        x, _ = self.down_proj(self.act_fn(x))
        return x


class GemmaMLP(LlamaMLP):
    pass


class LlamaDecoderLayer(torch.nn.Module):
    """The feed-forward half of vLLM's LlamaDecoderLayer.forward (the attention half is the identity here)."""
    __module__ = "vllm.model_executor.models.llama"

    def __init__(self, norm, mlp):
        super().__init__()
        self.mlp, self.post_attention_layernorm = mlp, norm

    def forward(self, hidden_states, residual):
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        hidden_states = self.mlp(hidden_states)
        return hidden_states, residual


class GemmaDecoderLayer(LlamaDecoderLayer):
    __module__ = "vllm.model_executor.models.gemma"


class Model(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def load_weights(self, weights):
        """vLLM's models' way: each weight written into its Parameter through `.data` (as vLLM's weight loaders
        write: no version counter moves), the names loaded returned."""
        params, loaded = dict(self.named_parameters()), set()
        for name, tensor in weights:
            params[name].data.copy_(tensor)
            loaded.add(name)
        return loaded


def _shards(full_gate_up, full_down, tp):
    """vLLM's per-rank weights: gate rows then up rows of this rank's d_ff/tp; down's matching columns."""
    gate, up = full_gate_up.chunk(2, dim=0)
    f = FF // tp
    return [(torch.cat([gate[r * f:(r + 1) * f], up[r * f:(r + 1) * f]]), full_down[:, r * f:(r + 1) * f])
            for r in range(tp)]


def _layer(style="llama", tp_rank=0, tp_size=1, bias=False, quant=UnquantizedLinearMethod, weights=None):
    torch.manual_seed(0)
    norm = (GemmaRMSNorm if style == "gemma" else RMSNorm)(D)
    act = GeluAndMul("tanh") if style == "gemma" else SiluAndMul()
    f = FF // tp_size
    gate_up = MergedColumnParallelLinear(2 * f, D, bias=bias, tp_rank=tp_rank, tp_size=tp_size, quant=quant)
    down = RowParallelLinear(D, f, bias=bias, tp_rank=tp_rank, tp_size=tp_size, quant=quant)
    if weights is not None:
        (gate_up.weight.data, down.weight.data), gate_up_bias, down_bias = weights
        if bias:
            gate_up.bias.data, down.bias.data = gate_up_bias, down_bias
    mlp = (GemmaMLP if style == "gemma" else LlamaMLP)(gate_up, down, act)
    return (GemmaDecoderLayer if style == "gemma" else LlamaDecoderLayer)(norm, mlp)


def _fuse(model, all_reduce=lambda t: t):
    blocks = fused_blocks.FusedBlocks()
    plans = vllm_blocks.plan_model(model, cpu=False, batch_invariant=False)  # no engine needed
    return vllm_blocks.fuse_model(model, plans, blocks, all_reduce=all_reduce)


@pytest.mark.parametrize("style", ["llama", "gemma"])
def test_fused_layer_returns_what_the_stock_layer_returns(style):
    layer = _layer(style, bias=style == "llama")
    model = Model([layer])
    x, residual = torch.randn(2, 5, D), torch.randn(2, 5, D)
    expected = layer(x, residual)
    names = [n for n, _ in model.named_parameters()]
    sk.coverage.reset()
    blocks = _fuse(model)
    assert list(blocks.fused) == ["layers.0"] and blocks.engine_path == {}
    assert isinstance(layer.post_attention_layernorm, fused_blocks.FusedNormMLP)
    assert isinstance(layer.mlp, fused_blocks.MlpComputedByNorm)
    assert [n for n, _ in model.named_parameters()] == names  # loading and reloading see the same names
    out, h = layer(x, residual)
    torch.testing.assert_close(h, expected[1])
    torch.testing.assert_close(out, expected[0])
    # Without a residual the norm returns one tensor, as the stock one does.
    torch.testing.assert_close(layer.mlp(layer.post_attention_layernorm(x)), _stock_no_residual(style, x))
    report = blocks.report()
    name = f"fused_gated_mlp/{'gemma_rms' if style == 'gemma' else 'rms'}"
    assert report["layers_fused"] == 1, report
    # No copy of any weight: the engine's memory (and KV cache) is what it is without the fused blocks.
    assert report["weights_prepared"] == {}, report
    if INTERPRETED:  # the kernels, interpreted, on the layer's own weights
        assert report["fallback_calls"] == 0 and report["kernel_calls"] == {name: 2}, report
    else:
        assert report["fallback_calls"] == 2, report
        assert any(f["op"] == name for f in sk.coverage.report()["fallbacks"])


def _stock_no_residual(style, x):
    layer = _layer(style, bias=style == "llama")
    return layer.mlp(layer.post_attention_layernorm(x))


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("bias", [False, True])
def test_shards_summed_by_the_engine_equal_the_unsharded_block(tp, bias):
    full = _layer(bias=bias)
    x, residual = torch.randn(7, D), torch.randn(7, D)
    expected_out, expected_h = full(x, residual)
    shards = _shards(full.mlp.gate_up_proj.weight.data, full.mlp.down_proj.weight.data, tp)
    gate_bias = full.mlp.gate_up_proj.bias.data.chunk(2) if bias else None
    partials, reduced_calls = [], []
    for rank, (gate_up, down) in enumerate(shards):
        f = FF // tp
        gub = (torch.cat([gate_bias[0][rank * f:(rank + 1) * f], gate_bias[1][rank * f:(rank + 1) * f]])
               if bias else None)
        layer = _layer(tp_rank=rank, tp_size=tp, bias=bias,
                       weights=((gate_up, down), gub, full.mlp.down_proj.bias.data if bias else None))
        layer.post_attention_layernorm.weight.data = full.post_attention_layernorm.weight.data
        blocks = _fuse(Model([layer]), all_reduce=lambda t: reduced_calls.append(t.shape) or t)
        plan = layer.post_attention_layernorm.sk_plan
        assert blocks.fused and plan.reduce and plan.down_bias_here == (rank == 0)
        assert tuple(layer.mlp.gate_up_proj.weight.shape) == (2 * FF // tp, D)
        out, h = layer(x, residual)
        torch.testing.assert_close(h, expected_h)
        partials.append(out)
    assert len(reduced_calls) == tp  # every rank hands its partial product to the engine's all-reduce
    torch.testing.assert_close(sum(partials), expected_out)


def test_no_reduce_at_tp1_or_without_reduce_results():
    layer = _layer()
    _fuse(Model([layer]), all_reduce=lambda t: pytest.fail("no all-reduce at tp=1"))
    assert not layer.post_attention_layernorm.sk_plan.reduce
    layer = _layer(tp_size=2)
    layer.mlp.down_proj.reduce_results = False
    _fuse(Model([layer]), all_reduce=lambda t: pytest.fail("reduce_results=False: the caller reduces"))
    layer(torch.randn(3, D), torch.randn(3, D))


def _uncovered():
    quantized = _layer(quant=Fp8LinearMethod)
    unknown_mlp = _layer()
    unknown_mlp.mlp.__class__ = type("FancyMLP", (LlamaMLP,), {})
    partial_norm = _layer()
    partial_norm.post_attention_layernorm.variance_size_override = 16
    return Model([_layer(), quantized, unknown_mlp, partial_norm])


def test_uncovered_layers_keep_the_engine_path_with_the_reason():
    model = _uncovered()
    blocks = _fuse(model)
    assert list(blocks.fused) == ["layers.0"]
    assert blocks.engine_path == {
        "layers.1": "LlamaDecoderLayer: gate_up_proj is quantized (Fp8LinearMethod)",
        "layers.2": "LlamaDecoderLayer: unknown MLP class FancyMLP",
        "layers.3": "LlamaDecoderLayer: post_attention_layernorm takes the variance over part of the hidden size "
                    "(var_hidden_size)",
    }
    assert not isinstance(model.layers[1].mlp, fused_blocks.MlpComputedByNorm)
    summary = sk.reports.fused_blocks_summary({"fused_blocks": blocks.report()})
    assert summary.startswith("fused blocks: 1 decoder layers fused") and "3 on the engine's path" in summary
    # LoRA: every layer keeps vLLM's path (vLLM wraps the linears after loading).
    lora = Model([_layer()])
    plans = vllm_blocks.plan_model(lora, type("Cfg", (), {"lora_config": object()})(), cpu=False,
                                   batch_invariant=False)
    assert plans == {"layers.0": "LoRA is enabled (vLLM wraps the linears after loading)"}
    # vLLM's sequence-parallel pass would hand the fused block a residual split across ranks.
    def config(enable_sp):
        pass_config = type("PassConfig", (), {"enable_sp": enable_sp})()
        return type("Cfg", (), {"lora_config": None,
                                "compilation_config": type("CC", (), {"pass_config": pass_config})()})()
    plans = vllm_blocks.plan_model(Model([_layer()]), config(True), cpu=False, batch_invariant=False)
    assert plans == {"layers.0": "vLLM's sequence-parallel pass is on (compilation_config.pass_config.enable_sp)"}
    plans = vllm_blocks.plan_model(Model([_layer()]), config(False), cpu=False, batch_invariant=False)
    assert isinstance(plans["layers.0"], fused_blocks.Plan)


def test_a_subclass_of_a_listed_layer_is_recorded_on_the_engine_path():
    # vLLM's EAGLE drafts subclass LlamaDecoderLayer in their own modules: left alone, and reported (strict: error).
    draft_layer = type("EagleLlamaDecoderLayer", (LlamaDecoderLayer,), {"__module__": "vllm.model_executor.models."
                                                                                      "llama_eagle"})
    layer = _layer()
    layer.__class__ = draft_layer
    model = Model([_layer(), layer])
    blocks = _fuse(model)
    assert list(blocks.fused) == ["layers.0"] and not isinstance(layer.mlp, fused_blocks.MlpComputedByNorm)
    assert blocks.engine_path == {"layers.1": (
        "EagleLlamaDecoderLayer: a subclass of LlamaDecoderLayer from vllm.model_executor.models.llama_eagle; only "
        "the listed classes themselves are fused (a subclass may change the MLP or the forward)")}
    with sk.coverage.strict(), pytest.raises(fused_blocks.UncoveredLayerError, match=r"layers\.1 \(EagleLlama"):
        _fuse(Model([_layer(), layer]))


@pytest.mark.parametrize("bias", [False, True])
def test_a_projection_returning_its_bias_separately_is_fused_only_without_one(bias):
    """skip_bias_add: the engine's MLP drops the bias the projection returns (TeleChat2 sets it on a gate/up
    projection without a bias, which is then an ordinary one); with a bias, fusing would add it."""
    proj = MergedColumnParallelLinear(2 * FF, D, bias=bias)
    proj.skip_bias_add = True
    miss = fused_blocks.linear_miss("gate_up_proj", proj, vllm_blocks.UNQUANTIZED)
    assert miss == ("gate_up_proj returns its bias separately (skip_bias_add)" if bias else None)


def test_gpu_layers_without_a_kernel_keep_the_engine_path(monkeypatch):
    # On a GPU a layer no kernel covers (device, dtype, shape) would run the op's PyTorch reference, slower than
    # the engine's own kernels: it keeps the engine's path. Weights not placed yet (meta) are fused: the op decides
    # at its calls. Here meta tensors, judged, stand for a device without kernels.
    unplaced = Model([_with_attention(_layer()).to("meta")])
    assert list(_fuse(unplaced).fused) == ["layers.0"]
    monkeypatch.setattr(fused_blocks, "UNJUDGED_DEVICES", ("cpu",))
    layer = _with_attention(_layer()).to("meta")
    model = Model([layer])
    blocks = _fuse(model)
    assert blocks.fused == {} and blocks.engine_path == {
        "layers.0": "LlamaDecoderLayer: no fused_gated_mlp kernel covers it (device type 'meta' has no kernels)"}
    assert not isinstance(layer.mlp, fused_blocks.MlpComputedByNorm)
    vllm_blocks.route_model_projections(model, blocks=blocks, batch_invariant=False)
    assert blocks.projections == {} and blocks.projections_engine_path["layers.0.self_attn.o_proj"] == \
        "no sk.ops.linear kernel covers it (device type 'meta' has no kernels)"


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an SM90 GPU (the op's kernels)")
def test_gpu_bf16_layers_are_fused_and_fp32_layers_keep_the_engine_path():
    covered, fp32 = _layer().to("cuda", torch.bfloat16), _layer().to("cuda")
    blocks = _fuse(Model([covered, fp32]))
    assert list(blocks.fused) == ["layers.0"]
    assert blocks.engine_path["layers.1"].startswith("LlamaDecoderLayer: no fused_gated_mlp kernel covers it (dtype")
    x, residual = torch.randn(3, D, device="cuda", dtype=torch.bfloat16), torch.randn(3, D, device="cuda",
                                                                                      dtype=torch.bfloat16)
    sk.coverage.reset()
    covered(x, residual)
    assert sk.coverage.report()["kernel_calls"].get("fused_gated_mlp/rms") == 1


class Attention(torch.nn.Module):
    """The projections of an attention block (the attention itself is the query slice here)."""

    def __init__(self, quant=UnquantizedLinearMethod, q=32, kv=8):
        super().__init__()
        self.q = q
        self.qkv_proj = QKVParallelLinear(q + 2 * kv, D, quant=quant)
        self.o_proj = QKVParallelLinear(D, q, quant=quant, bias=True)

    def forward(self, x):
        qkv, _ = self.qkv_proj(x)
        return self.o_proj(qkv[..., :self.q])[0]


def _with_attention(layer, **kwargs):
    layer.self_attn = Attention(**kwargs)
    return layer


def test_attention_projections_route_through_sk_linear():
    routed, quantized = _with_attention(_layer()), _with_attention(_layer(), quant=Fp8LinearMethod)
    model = Model([routed, quantized])
    x = torch.randn(2, 5, D)
    expected = routed.self_attn(x)
    method = routed.self_attn.qkv_proj.quant_method
    blocks = vllm_blocks.route_model_projections(model, blocks=fused_blocks.FusedBlocks(), batch_invariant=False)
    assert sorted(blocks.projections) == ["layers.0.self_attn.o_proj", "layers.0.self_attn.qkv_proj"]
    assert blocks.projections_engine_path == {"layers.1.self_attn.qkv_proj": "qkv_proj is quantized (Fp8LinearMethod)",
                                              "layers.1.self_attn.o_proj": "o_proj is quantized (Fp8LinearMethod)"}
    routed_method = routed.self_attn.qkv_proj.quant_method
    # A copy of the engine's method, of a subclass: isinstance checks and the method's state hold.
    assert routed_method is not method and isinstance(routed_method, UnquantizedLinearMethod)
    assert routed_method.engine_state == "kept" and type(routed_method).sk_replaced == "UnquantizedLinearMethod"
    sk.coverage.reset()
    torch.testing.assert_close(routed.self_attn(x), expected)
    linear = [f for f in sk.coverage.report()["fallbacks"] if f["op"] == "linear"]
    assert sum(f["count"] for f in linear) == 2  # both projections, through sk.ops.linear (fp32 CPU: reference)
    # Routing again (a second load of the same model) changes nothing.
    vllm_blocks.route_model_projections(model, blocks=blocks, batch_invariant=False)
    assert routed.self_attn.qkv_proj.quant_method is routed_method and len(blocks.projections) == 2
    summary = sk.reports.fused_blocks_summary({"fused_blocks": blocks.report()})
    assert "attention projections: 2 through sk.ops.linear, 2 calls (0 kernel, 2 fallback), 2 on the engine's " \
           "GEMM (o_proj is quantized (Fp8LinearMethod); qkv_proj is quantized (Fp8LinearMethod))" in summary


def test_projections_keep_the_engine_gemm_under_batch_invariance_lora_and_strict():
    model = Model([_with_attention(_layer())])
    blocks = vllm_blocks.route_model_projections(model, blocks=fused_blocks.FusedBlocks(), batch_invariant=True)
    assert blocks.projections == {} and set(blocks.projections_engine_path.values()) == {
        "VLLM_BATCH_INVARIANT=1 (vLLM's batch-invariant GEMMs)"}
    lora = type("Cfg", (), {"lora_config": object()})()
    blocks = vllm_blocks.route_model_projections(model, lora, blocks=fused_blocks.FusedBlocks(),
                                                 batch_invariant=False)
    assert set(blocks.projections_engine_path.values()) == {"LoRA is enabled (vLLM wraps the linears after loading)"}
    quantized = Model([_with_attention(_layer(), quant=Fp8LinearMethod)])
    with sk.coverage.strict(), pytest.raises(fused_blocks.UncoveredLayerError,
                                             match=r"projection layers\.0\.self_attn\.qkv_proj keeps vLLM's own GEMM"):
        vllm_blocks.route_model_projections(quantized, blocks=fused_blocks.FusedBlocks(), batch_invariant=False)


def test_cpu_routed_projections_keep_their_plain_weights():
    layer = _with_attention(_layer())
    vllm_blocks.plan_projections(Model([layer]), cpu=True)
    assert layer.self_attn.qkv_proj._cpu_skip_gemm_dispatch and layer.self_attn.o_proj._cpu_skip_gemm_dispatch


def test_strict_mode_makes_an_uncovered_layer_an_error_naming_it():
    model = _uncovered()
    with sk.coverage.strict(), pytest.raises(fused_blocks.UncoveredLayerError,
                                             match=r"decoder layer layers\.1 \(LlamaDecoderLayer\).*quantized"):
        _fuse(model)


def test_cpu_planned_projections_keep_their_plain_weights():
    layer = _layer()
    vllm_blocks.plan_model(Model([layer]), cpu=True, batch_invariant=False)
    assert layer.mlp.gate_up_proj._cpu_skip_gemm_dispatch and layer.mlp.down_proj._cpu_skip_gemm_dispatch


def test_switch_off_fuses_nothing():
    try:
        with sk.settings.override(fused_mlp=False):
            assert vllm_blocks.install() == "off (SK_FUSED_MLP=0)"
        assert vllm_blocks.report()["enabled"] is False
    finally:
        vllm_blocks.BLOCKS.disabled = None


def test_dynamo_traces_the_fused_layer_whole():
    layer = _layer("gemma")
    _fuse(Model([layer]))
    x, residual = torch.randn(4, D), torch.randn(4, D)
    eager = layer(x, residual)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")(x, residual)
    torch.testing.assert_close(compiled, eager)


def _new_weights(stock, names=None, seed=1):
    """Fresh values for `stock`'s parameters (those in `names`, default all), written into it through .data."""
    torch.manual_seed(seed)
    new = {n: torch.randn_like(p) * p.detach().std() + p.detach().mean()
           for n, p in stock.named_parameters() if names is None or n in names}
    for n, p in stock.named_parameters():
        if n in new:
            p.data.copy_(new[n])
    return new


def test_weights_the_engine_writes_after_loading_are_the_ones_the_block_computes_with():
    # The engine's loaders (reloads, RLHF weight updates) write through .data into the same Parameters: the op
    # reads them at each call, so nothing has to follow the writes.
    layer, stock = _layer(), _layer()
    model = Model([layer])
    _fuse(model)
    x, residual = torch.randn(3, D), torch.randn(3, D)
    torch.testing.assert_close(layer(x, residual), stock(x, residual))
    for names in ({"mlp.down_proj.weight"}, {"post_attention_layernorm.weight"}, {"mlp.gate_up_proj.weight"}, None):
        new = _new_weights(stock, names)
        model.load_weights([(f"layers.0.{n}", w) for n, w in new.items()])
        torch.testing.assert_close(layer(x, residual), stock(x, residual))
    assert sk.coverage.report()["weights_prepared"] == {}


def test_batch_invariant_mode_keeps_every_layer_on_vllms_path():
    model = Model([_layer(), _layer("gemma")])
    plans = vllm_blocks.plan_model(model, cpu=False, batch_invariant=True)
    assert set(plans.values()) == {vllm_blocks.BATCH_INVARIANT}
    blocks = vllm_blocks.fuse_model(model, plans, fused_blocks.FusedBlocks(), all_reduce=lambda t: t)
    assert blocks.fused == {} and set(blocks.engine_path) == {"layers.0", "layers.1"}


def test_a_second_model_in_the_process_is_reported_under_its_own_name():
    # E.g. a speculative-decoding draft model: its layers have the target model's names.
    blocks = fused_blocks.FusedBlocks()
    for model in (Model([_layer()]), Model([_layer(), _layer()])):
        plans = vllm_blocks.plan_model(model, cpu=False, batch_invariant=False)
        vllm_blocks.fuse_model(model, plans, blocks, all_reduce=lambda t: t)
    assert list(blocks.fused) == ["layers.0", "model1:layers.0", "model1:layers.1"]
    assert blocks.report()["layers_fused"] == 3


def test_a_model_built_after_another_was_freed_is_a_model_of_its_own(monkeypatch):
    # CPython can give a model built after another was freed the freed one's id(); the report must not take the
    # two for one. Every id() equal here stands for that reuse.
    monkeypatch.setattr(fused_blocks, "id", lambda obj: 1, raising=False)
    blocks = fused_blocks.FusedBlocks()
    first = Model([])
    assert blocks.scope(first) == "" and blocks.scope(first) == ""
    del first
    gc.collect()
    later = [Model([]) for _ in range(3)]
    assert [blocks.scope(m) for m in later] == ["model1:", "model2:", "model3:"]


def _loader_classes(base_loader, model, plans):
    """Stand-in loaders with a load_model of their own, each returning `model` (`plans` counts the plannings)."""

    class OwnLoader(base_loader.BaseModelLoader):  # e.g. tensorizer on a vLLM-tensorized model: no post-processing
        def download_model(self, model_config):
            pass

        def load_weights(self, model, model_config):
            pass

        def load_model(self, vllm_config, model_config, prefix=""):
            return model

    class ProcessingLoader(OwnLoader):  # post-processes through the name vLLM's base loader calls
        def load_model(self, vllm_config, model_config, prefix=""):
            config = types.SimpleNamespace(word_embeddings_untied_by_checkpoint=False, quantization=None,
                                           dtype=torch.float32)
            base_loader.process_weights_after_loading(model, config, torch.device("cpu"))
            return model

    class DelegatingLoader(OwnLoader):  # e.g. ModelExpress: another loader's load_model, then its own step
        def load_model(self, vllm_config, model_config, prefix=""):
            loaded = OwnLoader(load_config=None).load_model(vllm_config, model_config)
            plans.append("fused before the outer loader returned" if isinstance(
                loaded.layers[0].mlp, fused_blocks.MlpComputedByNorm) else "outer step on the loaded model")
            return loaded

    return OwnLoader, ProcessingLoader, DelegatingLoader


@pytest.mark.parametrize("kind", ["own", "processing", "delegating", "defined_after_install"])
def test_a_loader_with_a_load_model_of_its_own_gets_the_fused_blocks(monkeypatch, kind):
    # vLLM's tensorizer loader never calls process_weights_after_loading; its IPC loader calls its own import of
    # it; ModelExpress delegates to another loader. Each model is planned and fused once, by the outermost call.
    base_loader = pytest.importorskip("vllm.model_executor.model_loader.base_loader")
    from vllm.model_executor.model_loader.tensorizer_loader import TensorizerLoader

    blocks, plans = fused_blocks.FusedBlocks(), []
    monkeypatch.setattr(vllm_blocks, "BLOCKS", blocks)
    plan_model = vllm_blocks.plan_model
    monkeypatch.setattr(vllm_blocks, "plan_model", lambda *a, **k: plans.append("plan") or plan_model(*a, **k))
    model = Model([_layer(), _layer("gemma")])
    if kind != "defined_after_install":
        classes = _loader_classes(base_loader, model, plans)
    assert vllm_blocks.install().startswith(fused_blocks.WHAT)
    if kind == "defined_after_install":  # e.g. a plugin's loader: wrapped when its first instance is made
        classes = _loader_classes(base_loader, model, plans)
    else:
        assert set(classes) | {TensorizerLoader} <= set(
            vllm_blocks.loaders_with_own_load_model(base_loader.BaseModelLoader))
    loader = dict(zip(["own", "processing", "delegating"], classes)).get(kind, classes[0])(load_config=None)
    assert loader.load_model(None, None) is model
    assert set(blocks.fused) == {"layers.0", "layers.1"} and blocks.engine_path == {}
    assert all(isinstance(layer.mlp, fused_blocks.MlpComputedByNorm) for layer in model.layers)
    assert plans == (["outer step on the loaded model", "plan"] if kind == "delegating" else ["plan"])
