"""The pre-norm GEGLU block's two GEMMs through QuACK's CuTe-DSL kernels (SM90, inference on folded weights).

    h = gelu(r·(x @ W'_gateᵀ − μ·Σ_k W'_gate) + c_gate) · (r·(x @ W'_upᵀ − μ·Σ_k W'_up) + c_up)
    y = x + h @ W_downᵀ + b_down

with W' the LayerNorm-scaled weights, gate and up rows interleaved, and [Σ_k W'; c] the fold of
`fused_pre_norm_geglu._folded_gate_up`; μ and r are the row statistics of `_ln_stats_kernel`.

QuACK (github.com/Dao-AILab/quack, `pip install standardkernels[cute]`) builds Hopper GEMMs that Triton 3.6
cannot express: two-CTA clusters sharing operand tiles by TMA multicast, ping-pong consumer warpgroups (one
tile's epilogue runs beside the other's main loop) and tiles of any multiple of 16 columns. Its fn frontend
takes the epilogue as a Python function over the accumulator, so the gate/up product keeps ours: statistics,
shift, GELU and the gate·up product applied in registers, only h stored; its main loop runs while the statistics
kernel finishes, and only its epilogue waits for that kernel (`ColVecLoadAfterPrimary`). The down projection is
QuACK's GEMM with residual and bias in its epilogue. On the H200 the forward runs 5 % faster at the prefill shape and 10 % at
the seed shape than with our Triton GEMMs, the two measured side by side (results/h200/geglu/NOTES.md, "ninth
run").

Imported only where it can run (a CUDA device of compute capability 9.0 with QuACK installed); the op falls
back to its Triton GEMMs otherwise, and for decode (its split-K down kernel) and training (which stores the
pre-activations for the backward).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect

import cutlass
import cutlass.cute as cute
import quack
import torch
from cutlass import Float32
from quack.activation import gelu_erf, gelu_tanh_approx
from quack.epilogue.frontend import EpiMod, unpack
from quack.epilogue.ops import ColVecLoad, RowVecLoad
from quack.gemm_config import GemmConfig
from quack.gemm_interface import gemm_tuned


def _config(tile_m: int, tile_n: int, *, pingpong: bool, swizzle: int = 8) -> GemmConfig:
    # Clusters of two CTAs along M share each weight tile by multicast; a static persistent schedule (QuACK's
    # SM90 default) walking the tiles in swizzled groups (`swizzle` tiles wide, for L2 reuse).
    return GemmConfig(tile_m=tile_m, tile_n=tile_n, pingpong=pingpong, cluster_m=2, cluster_n=1,
                      is_dynamic_persistent=False, max_swizzle_size=swizzle, device_capacity=9)


# Per shape class of `fused_pre_norm_geglu.shape_class`, from ninth-run/experiments/quack_block.json (each GEMM
# alone and the whole forward, side by side in CUDA graphs). Gate/up's N counts gate and up columns together.
# small (seed): gate/up 128 × 192 cooperative 10.4 µs (ping-pong 12.5, 128 × 96 11.6, 64-row tiles 14.4-16.0);
#   down 64 × 96 8.8 µs (128 × 48 8.9; quack.json: 64 × 128 9.4-10.2, 128 × 96 10.9, one CTA per cluster 11.3).
# large (prefill): gate/up 128 × 192 ping-pong 1504 µs, 128 × 128 ping-pong 1494 (the forward with each: 2289
#   and 2382), cooperative 128 × 256 1853, 256 × 128 1795; down 128 × 128 ping-pong 774 µs, 128 × 256 816.
# Then each setting varied alone in the whole forward, three interleaved rounds (experiments/cute_sweep.json):
#   the table's ran fastest at the seed in every round (22.29-22.32 µs; swizzles 2-32 within 0.13 µs; down
#   tiles 128 × 48, ping-pong or in 1 × 2 clusters 0.3-0.5 µs slower; gate/up in 1 × 2 clusters, the dynamic
#   scheduler, 128 × 96 gate/up tiles 1.1-1.3 µs slower); at prefill the table of
#   then (down 128 × 128 ping-pong, gate/up swizzle 8) 2408-2413 µs, cooperative 128 × 256 down tiles
#   2383-2405, gate/up swizzle 16 2405-2412 (within the rounds' spread), swizzle 32 and 128-wide gate/up tiles
#   ~100 µs slower, the Triton GEMMs 2551-2563. Five more rounds of those two against that table
#   (cute_confirm.json): both together 2377-2402 µs, ahead in every round; the cooperative down tiles alone
#   2402-2413; that table 2431-2451 and an identical twin of it 2432-2438.
GATE_UP_CONFIGS = {"small": _config(128, 192, pingpong=False),
                   "large": _config(128, 192, pingpong=True, swizzle=16)}
DOWN_CONFIGS = {"small": _config(64, 96, pingpong=False), "large": _config(128, 256, pingpong=False)}


class ColVecLoadAfterPrimary(ColVecLoad):
    """A per-row vector written by the kernel this GEMM launched behind (programmatic dependent launch): waits
    for that kernel to finish, which also makes its writes visible (`griddepcontrol.wait`), before loading;
    then lets the next kernel launch (`griddepcontrol.launch_dependents`, which QuACK otherwise issues after
    the tile loop)."""

    def config_key(self):
        # QuACK's compile cache (on disk too) knows an op by its type, name and this key: the source of what this
        # op and `_main_loop_before_wait` put into the kernel, so that an edit of either compiles afresh.
        return (*super().config_key(), _waiting_source_digest())

    @cute.jit
    def begin(self, gemm, param, smem_tensor, ctx):
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
        return ColVecLoad.begin(self, gemm, param, smem_tensor, ctx)


@functools.cache
def _main_loop_before_wait(gemm_cls):
    """`gemm_cls` launched dependently but with no wait before its first load: its main loop on x and the
    folded weights (older than the statistics kernel) runs while the statistics kernel finishes, and only the
    epilogue's statistics load (`ColVecLoadAfterPrimary`) waits for it.
    QuACK 0.6.5's SM90 GEMM reads its `use_pdl` on the host for the launch attribute, then, while `launch`
    traces the kernel body, for the producer's wait before its first load and the consumer's
    launch_dependents: the flag stays set for the first and is cleared for the trace."""
    class GemmWaitingInEpilogue(gemm_cls):
        def kernel(self, *args, **kwargs):
            launcher = super().kernel(*args, **kwargs)
            trace_and_launch = launcher.launch

            def launch(*launch_args, **launch_kwargs):
                use_pdl, self.use_pdl = self.use_pdl, False
                try:
                    return trace_and_launch(*launch_args, **launch_kwargs)
                finally:
                    self.use_pdl = use_pdl
            launcher.launch = launch
            return launcher
    GemmWaitingInEpilogue.__qualname__ = GemmWaitingInEpilogue.__name__ = f"{gemm_cls.__name__}_WaitingInEpilogue"
    return GemmWaitingInEpilogue


@functools.cache
def _waiting_source_digest() -> str:
    sources = inspect.getsource(ColVecLoadAfterPrimary) + inspect.getsource(_main_loop_before_wait)
    return hashlib.sha256(sources.encode()).hexdigest()[:16]


class _EpiModWaitingInEpilogue(EpiMod):
    """An epilogue whose GEMM kernels wait for the kernel before them in the epilogue only
    (`_main_loop_before_wait`)."""

    def _mint(self, *key):
        return _main_loop_before_wait(super()._mint(*key))


# The gate/up GEMM waits for the statistics kernel where its epilogue reads them, its main loop running beside
# that kernel: seed 21.5 µs against 22.3 (results/h200/geglu/2026-12-01/eleventh-run/experiments/stats_overlap.json).
# Written against QuACK 0.6.5's kernel (see `_main_loop_before_wait`); any other version keeps QuACK's wait
# before the first load.
WAIT_IN_EPILOGUE = quack.__version__ == "0.6.5"


class ColVecFromMainLoop(ColVecLoad):
    """A per-row statistic that the GEMM's main loop put into this op's shared memory (`_row_stats_in_main_loop`):
    no load, only the epilogue's view of it. Its tensor argument is where the GEMM also stores it."""

    @cute.jit
    def begin(self, gemm, param, smem_tensor, ctx):
        tDsV = ctx.partition_for_epilogue_fn(cute.make_tensor(
            smem_tensor.iterator, cute.make_layout((ctx.tile_M, ctx.tile_N), stride=self._broadcast_stride())))
        tDsV_sub = cute.group_modes(tDsV, 3, cute.rank(tDsV))[None, None, None, 0]
        return [tDsV, cute.make_rmem_tensor(tDsV_sub.layout, gemm.acc_dtype)]


@dataclasses.dataclass(frozen=True)
class _ReleaseHooks:
    """A GEMM's operand pipeline that calls `before(stage)` before each consumer release and `after()` after it (a
    dataclass, as the pipeline is, so that the DSL can carry it through dynamic control flow)."""
    pipeline: object
    before: object
    after: object

    def __getattr__(self, name):
        return getattr(self.pipeline, name)

    def consumer_release(self, state, *args, **kwargs):
        self.before(state.index)
        released = self.pipeline.consumer_release(state, *args, **kwargs)
        self.after()
        return released


@functools.cache
def _row_stats_in_main_loop(gemm_cls, work="copy and sum"):
    """`gemm_cls` computing LayerNorm's row statistics of A (x) itself, from the k-tiles its main loop has in shared
    memory: while a k-tile's wgmma runs, each of the 256 consumer threads sums half of one of the tile's 128 rows
    (Σx and Σ(x − c)², c the row's first element in shared memory), two threads a row. After the loop the two
    halves are added and mean and 1/std written to the `ColVecFromMainLoop` ops' shared memory for the epilogue
    (and, by the first column of tiles, to their tensors). Launched in stream order, as the op's first kernel.
    Cooperative 128-row tiles of 64-element k-tiles only."""
    class GemmWithRowStats(gemm_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.use_pdl = False

        def epi_get_smem_tensors(self, params, storage):
            tensors = super().epi_get_smem_tensors(params, storage)
            tile_m, _, tile_k = self.cta_tile_shape_mnk
            assert not self.pingpong and tile_m == 128 and tile_k * self.a_dtype.width == 128 * 8, \
                "row statistics in the main loop: cooperative 128-row tiles of 128-byte k-tiles only"
            # The k-tiles as rows of 128 bytes: the 128-byte swizzle only permutes 16-byte chunks within a row,
            # which a row's sums do not see.
            self._x_rows = storage.sA.get_tensor(
                cute.make_layout((tile_m, tile_k, self.ab_stage), stride=(tile_k, 1, tile_m * tile_k)))
            self._stats_smem = tensors["mean"], tensors["rstd"]
            return tensors

        @cute.jit
        def mma(self, ab_pipeline, ab_read_state, mma_fn, acc, acc_slow, k_tile_cnt, warp_group_idx):
            tidx = cute.arch.thread_idx()[0]
            row, half = tidx // 2, tidx % 2
            half_k = self.cta_tile_shape_mnk[2] // 2
            sums = cute.make_rmem_tensor((3,), Float32)  # c, Σx, Σ(x − c)² over this thread's half of the row
            sums.fill(0.0)
            ab_pipeline.consumer_wait(ab_read_state)  # the first k-tile, for c (the main loop waits for it again)
            sums[0] = self._x_rows[row, 0, ab_read_state.index].to(Float32)
            x_half = cute.make_rmem_tensor((half_k,), self._x_rows.element_type)

            def copy_rows(stage):
                # 16-byte chunks of the row, this thread's half of them, in an order that puts each group of 8
                # threads (4 rows, as a 128-bit shared load serves them) on 8 different chunks of 32 banks.
                x_row = self._x_rows[row, None, stage]
                for j in cutlass.range_constexpr(half_k // 8):
                    chunk = half * (half_k // 8) + (j + row) % (half_k // 8)
                    cute.autovec_copy(cute.local_tile(x_row, (8,), (chunk,)), cute.local_tile(x_half, (8,), (j,)))

            def sum_rows():
                x = x_half.load().to(Float32)
                centered = x - sums[0]
                sums[1] = sums[1] + x.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
                sums[2] = sums[2] + (centered * centered).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)

            # Each k-tile's rows are copied to registers as its stage is released (after its wgmmas are done and
            # the next k-tile's issued; exactly once), and summed once the stage is free for the next load.
            def keep_copy():  # the least that keeps the copies: a bf16 sum
                sums[1] = sums[1] + Float32(x_half.load().reduce(cute.ReductionOp.ADD, x_half.element_type(0.0), 0))

            hooks = {"copy and sum": (copy_rows, sum_rows), "copy": (copy_rows, keep_copy),
                     "none": (lambda stage: None, lambda: None)}[work]
            ab_read_state = super().mma(_ReleaseHooks(ab_pipeline, *hooks), ab_read_state, mma_fn, acc,
                                        acc_slow, k_tile_cnt, warp_group_idx)
            self._row_sums = sums
            return ab_read_state

        @cute.jit
        def epi_visit_acc(self, params, acc, tiled_mma, tile_coord_mnkl, tidx):
            super().epi_visit_acc(params, acc, tiled_mma, tile_coord_mnkl, tidx)
            sums = self._row_sums
            c = sums[0]
            total = sums[1] + cute.arch.shuffle_sync_bfly(sums[1], offset=1)
            squares = sums[2] + cute.arch.shuffle_sync_bfly(sums[2], offset=1)
            d = params.d_model
            # Over the row's d elements: Σ(x − c) and Σ(x − c)², less what the k-tiles' zero padding added (c² each).
            centered = total - d * c
            centered_squares = squares - params.k_padding * c * c
            mean = total / d
            rstd = cute.math.rsqrt((centered_squares - centered * centered / d) / d + params.eps)
            row = tidx // 2
            row_in_m = tile_coord_mnkl[0] * self.cta_tile_shape_mnk[0] + row
            (mean_smem, rstd_smem), mean_out, rstd_out = self._stats_smem, params.mean, params.rstd
            if tidx % 2 == 0:
                mean_smem[row] = mean
                rstd_smem[row] = rstd
                if tile_coord_mnkl[1] == 0 and row_in_m < cute.size(mean_out, mode=[1]):
                    mean_out[0, row_in_m] = mean
                    rstd_out[0, row_in_m] = rstd
    GemmWithRowStats.__qualname__ = GemmWithRowStats.__name__ = f"{gemm_cls.__name__}_WithRowStats"
    return GemmWithRowStats


class _EpiModWithRowStats(EpiMod):
    """An epilogue whose GEMM kernels compute the row statistics in their main loop (`_row_stats_in_main_loop`)."""

    work = "copy and sum"

    def _mint(self, *key):
        return _row_stats_in_main_loop(super()._mint(*key), self.work)


def _folded_ln_geglu(gelu):
    # The statistics are per row (a column vector over M), the fold's two rows per column; named explicitly so
    # that M == 2·d_ff cannot make QuACK's shape inference ambiguous.
    def folded_ln_geglu(acc, mean, rstd, colsum, shift):
        # acc pairs adjacent columns (gate, up): the weights' rows are interleaved.
        gate, up = unpack((acc - colsum * mean) * rstd + shift)
        return {"h": gelu(gate) * up}
    stats_load, epi_mod = (ColVecLoadAfterPrimary, _EpiModWaitingInEpilogue) if WAIT_IN_EPILOGUE else (
        ColVecLoad, EpiMod)
    return epi_mod(folded_ln_geglu, outputs=("h",), mode="acc_pair", ops={
        "mean": stats_load("mean"), "rstd": stats_load("rstd"),
        "colsum": RowVecLoad("colsum"), "shift": RowVecLoad("shift")})


def _folded_ln_geglu_with_row_stats(gelu, work="copy and sum"):
    # As `_folded_ln_geglu`; eps, d_model and k_padding (the zeros that fill x's last k-tile) are read by the
    # statistics (`_row_stats_in_main_loop`), not by this function.
    def folded_ln_geglu_with_row_stats(acc, mean, rstd, colsum, shift, eps, d_model, k_padding):
        gate, up = unpack((acc - colsum * mean) * rstd + shift + (0.0 if work == "copy and sum" else 0.0))
        return {"h": gelu(gate) * up}
    epi_mod_cls = type(f"_EpiModWithRowStats_{work.replace(' ', '_')}", (_EpiModWithRowStats,), {"work": work})
    return epi_mod_cls(folded_ln_geglu_with_row_stats, outputs=("h",), mode="acc_pair", ops={
        "mean": ColVecFromMainLoop("mean"), "rstd": ColVecFromMainLoop("rstd"),
        "colsum": RowVecLoad("colsum"), "shift": RowVecLoad("shift")})


# Module globals, so that QuACK's compile cache can find them again by import (its `module_locator`).
FOLDED_LN_GEGLU_ERF = _folded_ln_geglu(gelu_erf)
FOLDED_LN_GEGLU_TANH = _folded_ln_geglu(gelu_tanh_approx)
FOLDED_LN_GEGLU_ERF_ROW_STATS = _folded_ln_geglu_with_row_stats(gelu_erf)
FOLDED_LN_GEGLU_TANH_ROW_STATS = _folded_ln_geglu_with_row_stats(gelu_tanh_approx)
FOLDED_LN_GEGLU_ERF_ROW_STATS_COPY = _folded_ln_geglu_with_row_stats(gelu_erf, "copy")
FOLDED_LN_GEGLU_ERF_ROW_STATS_NONE = _folded_ln_geglu_with_row_stats(gelu_erf, "none")


ROW_STATS_WORK = "copy and sum"  # experiment switch


def gate_up_with_row_stats(x: torch.Tensor, stats: torch.Tensor, folded: torch.Tensor, fold: torch.Tensor,
                           h: torch.Tensor, eps: float, approximate: str, shape_class: str) -> None:
    """As `gate_up`, computing the statistics itself (into stats) instead of reading them."""
    epilogue = FOLDED_LN_GEGLU_TANH_ROW_STATS if approximate == "tanh" else FOLDED_LN_GEGLU_ERF_ROW_STATS
    epilogue = {"copy": FOLDED_LN_GEGLU_ERF_ROW_STATS_COPY, "none": FOLDED_LN_GEGLU_ERF_ROW_STATS_NONE}.get(
        ROW_STATS_WORK, epilogue)
    d = x.shape[1]
    tile_k = 128 // x.element_size()  # k-tiles of 128 bytes (QuACK's default for 16-bit operands)
    # QuACK takes its vectors on 16-byte boundaries (see `gate_up`): else 1/std goes through a copy.
    rstd = stats[1:2] if stats.shape[1] % 4 == 0 else torch.empty_like(stats[1:2])
    epilogue(x, folded.T, out={"h": h}, store_d=False, config=GATE_UP_CONFIGS[shape_class], tuned=False,
             mean=stats[0:1], rstd=rstd, colsum=fold[0:1], shift=fold[1:2], eps=float(eps),
             d_model=float(d), k_padding=float(-d % tile_k))
    if rstd.data_ptr() != stats[1:2].data_ptr():
        stats[1:2].copy_(rstd)


def gate_up(x: torch.Tensor, stats: torch.Tensor, folded: torch.Tensor, fold: torch.Tensor, h: torch.Tensor,
            approximate: str, shape_class: str) -> None:
    """h ← the GEGLU of LayerNorm(x)'s gate and up projections, from x [M, d], stats [2, M] (mean; 1/std),
    folded [2·ff, d] and fold [2, 2·ff] (see the module docstring)."""
    epilogue = FOLDED_LN_GEGLU_TANH if approximate == "tanh" else FOLDED_LN_GEGLU_ERF
    # QuACK loads its vectors from 16-byte boundaries: the statistics' second row starts on one only when M is a
    # multiple of 4 (the fold's, at 2·d_ff floats, always does); otherwise it is copied (one small kernel).
    rstd = stats[1:2] if stats.shape[1] % 4 == 0 else stats[1:2].clone()
    epilogue(x, folded.T, out={"h": h}, store_d=False, config=GATE_UP_CONFIGS[shape_class], tuned=False,
             mean=stats[0:1], rstd=rstd, colsum=fold[0:1], shift=fold[1:2])


def down(h: torch.Tensor, down_weight: torch.Tensor, down_bias: torch.Tensor | None, x: torch.Tensor,
         y: torch.Tensor, shape_class: str) -> None:
    """y ← x + h @ down_weightᵀ + down_bias (contiguous, on a 16-byte boundary)."""
    if down_bias is not None and down_bias.dtype == torch.float64:  # QuACK's vectors are 16- or 32-bit floats
        down_bias = down_bias.float()
    # gemm_tuned's undecorated function: the GEMM at an explicit config, without the autotuner around it.
    gemm_tuned.fn(h, down_weight.T, y, C=x, bias=down_bias, config=DOWN_CONFIGS[shape_class])
