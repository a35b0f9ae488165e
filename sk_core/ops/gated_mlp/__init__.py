"""The gated-MLP family: norm → merged gate/up GEMM → gated activation → down GEMM as one op.

    out, h = sk.ops.fused_gated_mlp(x, norm_weight, gate_up_weight, down_weight, eps, residual=residual,
                                    norm="rms" | "gemma_rms" | "layer", activation="silu" | "gelu" | "gelu_tanh")

Modules: `reference` (the PyTorch computation: fallback, fp64 oracle, baseline), `weights` (the prepared
gate/up weights, cached), `triton_kernels` (kernels, launchers, the config table; `forward_kernels` and
`GemmConfig` are the documented-internal entry points the benchmark's sweep and the tests use), `op` (the
custom op `sk::fused_gated_mlp`, dispatch and argument checks).
"""
from sk.ops.gated_mlp.op import coverage_name, fused_gated_mlp
from sk.ops.gated_mlp.reference import ACTIVATIONS, NORMS, gated_mlp_reference

__all__ = ["fused_gated_mlp", "gated_mlp_reference", "coverage_name", "NORMS", "ACTIVATIONS"]
