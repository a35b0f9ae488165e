"""The gated-MLP family: norm → gate/up GEMM → gated activation → down GEMM as one op.

    out, h = sk.ops.fused_gated_mlp(x, norm_weight, gate_up_weight, down_weight, eps, residual=residual,
                                    norm="rms" | "gemma_rms" | "layer", activation="silu" | "gelu" | "gelu_tanh")
    y = sk.ops.fused_pre_norm_geglu(x, ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias,
                                    down_weight, down_bias, eps, approximate="none" | "tanh")

Modules, one op's kernel → reference → custom op → autograd → API apart from the other's, sharing `common`:
- `common`: what both ops' kernels and launchers share (`TileConfig`, the Triton tile helpers `_tile_coords` /
  `_tile_product`, the TMA descriptor fast path, cdiv / next_power_of_2 / align, sm_count, TMA_ALIGN).
- engine form (`fused_gated_mlp`): `reference` (the PyTorch computation: fallback, fp64 oracle, baseline),
  `triton_kernels` (kernels, launchers, the config table),
  `op` (the custom op `sk::fused_gated_mlp`, dispatch and argument checks).
- one projection (`linear`, the down kernel on its own for the decoder's other weight streams): `linear`
  (reference, custom op `sk::linear`, dispatch, argument checks), its launcher in `triton_kernels`.
- pre-norm GEGLU (`fused_pre_norm_geglu`): `geglu_kernels` (its Triton kernels, config tables, forward
  launcher), `geglu` (reference, weight copies, custom ops and fakes, autograd, step-graph replay, the public
  function), `quack_backend` (whether QuACK's CuTe-DSL GEMMs may run: version and structure check) and
  `quack_gemms` (those GEMMs, imported only through `quack_backend.available`).

Imports point one way: common ← {triton_kernels, geglu_kernels, quack_gemms}; reference ← op;
triton_kernels ← linear;
quack_backend ← geglu_kernels ← geglu (tests/test_package.py checks there is no cycle).

Internal, for benchmarks and tests (names without a leading underscore, listed in each module's docstring; no
argument checks, no coverage decisions): `triton_kernels.forward_kernels` / `linear_kernels` / `linear_config` /
`linear_counters` / `capture_counters` / `split_counters` / `GemmConfig` / `choose_configs` / `fit_configs` /
`fit_split` / the kernel objects, `geglu_kernels.forward_kernels` / `GemmConfig` /
`choose_configs` / `shape_class` / the config tables / the kernel objects, `geglu.fold_gate_up` /
`folded_gate_up` / `compute_weight` / `ln_backward` / `geglu_op` / `step_graphs`, `quack_backend.available`,
`common.cdiv` / `align` / `next_power_of_2` / `CHECK_DESCRIPTORS`. Nothing outside the package uses its private
names (tests/test_package.py checks).
"""
from sk.ops.gated_mlp.geglu import fused_pre_norm_geglu, fused_pre_norm_geglu_reference
from sk.ops.gated_mlp.linear import linear, linear_kernel_miss, linear_reference
from sk.ops.gated_mlp.op import coverage_name, fused_gated_mlp, kernel_miss, prepare_weights
from sk.ops.gated_mlp.reference import ACTIVATIONS, NORMS, gated_mlp_reference

__all__ = ["fused_gated_mlp", "gated_mlp_reference", "coverage_name", "kernel_miss", "prepare_weights", "NORMS",
           "ACTIVATIONS",
           "linear", "linear_reference", "linear_kernel_miss",
           "fused_pre_norm_geglu", "fused_pre_norm_geglu_reference"]
