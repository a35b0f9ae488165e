"""Stand-ins for the engine classes the fused-block swap reads, shared by the vLLM and SGLang layer tests: the
attributes `sk.adapters.fused_blocks` plans from (linears with quant_method, tp_rank/tp_size, reduce_results,
skip_bias_add, gather_output, input_is_parallel; RMSNorm's options; the activations' approximate), matched by
class name as the adapters match the engines' classes. Weights are a Parameter subclass with a
`__torch_function__`, as both engines' `ModelWeightParameter` (the op must cache any copy it makes of them)."""
import torch
import torch.nn.functional as F


class ModelWeightParameter(torch.nn.Parameter):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def weight(*shape) -> ModelWeightParameter:
    return torch.nn.Parameter._make_subclass(ModelWeightParameter, torch.randn(*shape) / shape[-1] ** 0.5, False)


class UnquantizedLinearMethod:
    def __init__(self):
        self.engine_state = "kept"  # an attribute the engine's method sets: a routed copy keeps it

    def apply(self, layer, x, bias=None):
        return F.linear(x, layer.weight, bias)


class _Linear(torch.nn.Module):
    def __init__(self, out_features, in_features, tp_rank=0, tp_size=1, quant=UnquantizedLinearMethod, *,
                 bias=False, reduce_results=True):
        super().__init__()
        self.weight = weight(out_features, in_features)
        self.bias = torch.nn.Parameter(torch.randn(out_features), requires_grad=False) if bias else None
        self.quant_method = quant()
        self.tp_rank, self.tp_size, self.reduce_results = tp_rank, tp_size, reduce_results
        self.skip_bias_add, self.gather_output, self.input_is_parallel = False, False, True


class MergedColumnParallelLinear(_Linear):
    def forward(self, x):
        return F.linear(x, self.weight, self.bias), None


class RowParallelLinear(_Linear):
    def forward(self, x):  # this rank's partial product; bias on rank 0 (the all-reduce is the test's)
        return F.linear(x, self.weight, self.bias if self.tp_rank == 0 else None), None


class QKVParallelLinear(_Linear):
    """As the engines' attention projections (QKVParallelLinear, RowParallelLinear): forward through
    quant_method.apply, the hook sk.ops.linear is routed in by."""

    def forward(self, x):
        return self.quant_method.apply(self, x, self.bias), None


class RMSNorm(torch.nn.Module):
    def __init__(self, hidden_size, eps=1e-6, var_hidden_size=None, cast_x_before_out_mul=False,
                 fp32_residual=False, has_weight=True, weight_dtype=None, override_orig_dtype=None):
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden_size), requires_grad=False)
        self.variance_epsilon = eps
        self.variance_size_override = var_hidden_size
        self.cast_x_before_out_mul, self.fp32_residual = cast_x_before_out_mul, fp32_residual
        self.has_weight, self.override_orig_dtype = has_weight, override_orig_dtype

    def scale(self):
        return self.weight

    def forward(self, x, residual=None, post_residual_addition=None):
        h = x if residual is None else x + residual
        out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * self.scale()
        return out if residual is None else (out, h)


class GemmaRMSNorm(RMSNorm):
    def scale(self):
        return 1 + self.weight


class SiluAndMul(torch.nn.Module):
    def forward(self, x):
        g, u = x.chunk(2, dim=-1)
        return F.silu(g) * u


class GeluAndMul(torch.nn.Module):
    def __init__(self, approximate="none"):  # vLLM's default (erf); SGLang's is "tanh"
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        g, u = x.chunk(2, dim=-1)
        return F.gelu(g, approximate=self.approximate) * u
