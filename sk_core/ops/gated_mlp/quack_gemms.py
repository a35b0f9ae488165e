"""The pre-norm GEGLU op's two GEMMs through QuACK's CuTe-DSL kernels (SM90, inference on folded weights): the
QuACK backend of `geglu_kernels.forward_kernels`, imported only through `quack_backend.available`, which checks
the installed QuACK's version and structure first.

    h = gelu(r·(x @ W'_gateᵀ − μ·Σ_k W'_gate) + c_gate) · (r·(x @ W'_upᵀ − μ·Σ_k W'_up) + c_up)
    y = x + h @ W_downᵀ + b_down

with W' the LayerNorm-scaled weights, gate and up rows interleaved, and [Σ_k W'; c] the fold of
`geglu.folded_gate_up`; μ and r are the row statistics of `geglu_kernels`' `_ln_stats_kernel`.

QuACK (github.com/Dao-AILab/quack, `pip install standardkernels[cute]`) builds Hopper GEMMs that Triton 3.6
cannot express: two-CTA clusters sharing operand tiles by TMA multicast, ping-pong consumer warpgroups (one
tile's epilogue runs beside the other's main loop) and tiles of any multiple of 16 columns. Its fn frontend
takes the epilogue as a Python function over the accumulator, so the gate/up product keeps ours: statistics,
shift, GELU and the gate·up product applied in registers, only h stored. In the small class the GEMM computes
the statistics itself, in the producer warps QuACK leaves idle (`_row_stats_in_idle_warps`); elsewhere its main
loop runs while the statistics kernel finishes, and only its epilogue waits for that kernel
(`ColVecLoadAfterPrimary`). The down projection is QuACK's GEMM with residual and bias in its epilogue, at small
shapes in clusters of four CTAs sharing h's tiles where those clusters fit on the GPU at once (`DOWN_IN_ONE_WAVE`).
Each of these was timed on the H200 side by side with what it replaced (results/h200/geglu/README.md, the entries
"2026-11-30, ninth run" to "2026-12-01, thirteenth run").

Imported only where it can run (a CUDA device of compute capability 9.0 with a QuACK that `quack_backend`
admits); the op runs its Triton GEMMs otherwise, and for decode (its split-K down kernel) and training (which
stores the pre-activations for the backward).

Nothing here changes QuACK for other callers: the kernels are our subclasses of QuACK's GEMM (made per GEMM
class, `_main_loop_before_wait`, `_row_stats_in_idle_warps`), and the one module attribute replaced,
`cute.arch.setmaxregister_decrease` (QuACK's kernels call it through the module, which is how the statistics
warps are traced in), is replaced only while one of our row-statistics GEMMs traces its kernel
(`_row_stats_hook`).

Internal, for `geglu_kernels` and the tests: `GATE_UP_CONFIGS`, `DOWN_CONFIGS`, `DOWN_IN_ONE_WAVE`,
`CONFIG_SOURCES`, `WAIT_IN_EPILOGUE`, `gate_up`, `down`, `down_config`, `computes_row_stats`,
`row_stats_counters`.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import inspect
import threading

import cutlass
import cutlass.cute as cute
import quack
import torch
from cutlass import Float32, Int32
from cutlass.pipeline import NamedBarrier
from quack.activation import gelu_erf, gelu_tanh_approx
from quack.compile_utils import make_fake_tensor
from quack.cute_dsl_utils import get_max_active_clusters
from quack.epilogue.frontend import EpiMod, unpack
from quack.epilogue.ops import ColVecLoad, EpiOp, RowVecLoad, Scalar
from quack.gemm_config import GemmConfig
from quack.gemm_interface import gemm_tuned
from quack.sync.barrier import release_add

from sk.ops.gated_mlp.common import cdiv


def _config(tile_m: int, tile_n: int, *, pingpong: bool, swizzle: int = 8, cluster: tuple[int, int] = (2, 1)
            ) -> GemmConfig:
    # Clusters of CTAs sharing operand tiles by multicast (by default two along M sharing each weight tile); a
    # static persistent schedule (QuACK's SM90 default) walking the tiles in swizzled groups (`swizzle` tiles
    # wide, for L2 reuse).
    return GemmConfig(tile_m=tile_m, tile_n=tile_n, pingpong=pingpong, cluster_m=cluster[0], cluster_n=cluster[1],
                      is_dynamic_persistent=False, max_swizzle_size=swizzle, device_capacity=9)


# Per shape class of `geglu_kernels.shape_class` (gate/up's N counts gate and up columns together): the
# fastest whole forward in CUDA graphs, variants interleaved. Tiles and ping-pong from
# results/h200/geglu/2026-11-30/ninth-run/experiments/quack_block.json, each setting then varied alone in
# results/h200/geglu/2026-11-30/ninth-run/experiments/cute_sweep.json; prefill's cooperative 128 × 256 down
# tiles and gate/up swizzle 16 from results/h200/geglu/2026-11-30/ninth-run/experiments/cute_confirm.json.
GATE_UP_CONFIGS = {"small": _config(128, 192, pingpong=False),
                   "large": _config(128, 192, pingpong=True, swizzle=16)}
DOWN_CONFIGS = {"small": _config(64, 96, pingpong=False), "large": _config(128, 256, pingpong=False)}
# small, where all its clusters fit on the GPU at once (`_down_config`): down in 128 × 64 tiles, clusters of 1 × 4
# CTAs sharing each h tile by multicast, so each CTA reads less of h from L2
# (results/h200/geglu/2026-12-01/twelfth-run/experiments/down_1x4.json). Where they do not all fit (the H200 holds
# 30 clusters of four: results/h200/geglu/2026-12-01/twelfth-run/experiments/cluster4.json), a second round of
# tiles costs more than the multicast saves.
DOWN_IN_ONE_WAVE = _config(128, 64, pingpong=False, cluster=(1, 4))
# The committed result each entry above was chosen from (QuACK's GemmConfig has no field for it).
_NINTH = "results/h200/geglu/2026-11-30/ninth-run/experiments"
CONFIG_SOURCES = {
    ("gate_up", "small"): f"{_NINTH}/quack_block.json; {_NINTH}/cute_sweep.json",
    ("gate_up", "large"): f"{_NINTH}/quack_block.json; {_NINTH}/cute_sweep.json; {_NINTH}/cute_confirm.json (swizzle)",
    ("down", "small"): f"{_NINTH}/quack_block.json; {_NINTH}/cute_sweep.json",
    ("down", "large"): f"{_NINTH}/cute_confirm.json",
    ("down", "one_wave"): "results/h200/geglu/2026-12-01/twelfth-run/experiments/down_1x4.json",
}


class ColVecLoadAfterPrimary(ColVecLoad):
    """A per-row vector written by the kernel this GEMM launched behind (programmatic dependent launch): waits
    for that kernel to finish, which also makes its writes visible (`griddepcontrol.wait`), before loading;
    then lets the next kernel launch (`griddepcontrol.launch_dependents`, which QuACK otherwise issues after
    the tile loop)."""

    def config_key(self):
        # QuACK's compile cache (on disk too) knows an op by its type, name and this key: the source of what this
        # op and `_main_loop_before_wait` put into the kernel, so that an edit of either compiles afresh.
        return (*super().config_key(), _source_digest(ColVecLoadAfterPrimary, _main_loop_before_wait))

    @cute.jit
    def begin(self, gemm, param, smem_tensor, ctx):
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
        return ColVecLoad.begin(self, gemm, param, smem_tensor, ctx)


@functools.cache
def _main_loop_before_wait(gemm_cls):
    """`gemm_cls` launched dependently but with no wait before its first load: its main loop on x and the
    folded weights (complete once the statistics kernel lets this one launch: that kernel first waits for the
    kernels before the op) runs while the statistics kernel finishes, and only the epilogue's statistics load
    (`ColVecLoadAfterPrimary`) waits for it.
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
def _source_digest(*code) -> str:
    """A digest of the source of `code` (classes and functions): for QuACK's compile cache key, which covers
    QuACK's own source but not ours."""
    return hashlib.sha256("".join(inspect.getsource(c) for c in code).encode()).hexdigest()[:16]


class _EpiModWaitingInEpilogue(EpiMod):
    """An epilogue whose GEMM kernels wait for the kernel before them in the epilogue only
    (`_main_loop_before_wait`)."""

    def _mint(self, *key):
        return _main_loop_before_wait(super()._mint(*key))


# The gate/up GEMM waits for the statistics kernel only where its epilogue reads them, its main loop running
# beside that kernel (results/h200/geglu/2026-12-01/eleventh-run/experiments/stats_overlap.json). Written against
# QuACK 0.6.5's kernel (see `_main_loop_before_wait`), the only version `quack_backend` admits; were another let
# through, it would keep QuACK's wait before the first load.
WAIT_IN_EPILOGUE = quack.__version__ == "0.6.5"


class KernelTensor(EpiOp):
    """A tensor that the GEMM reads or writes outside its epilogue's tiles (`_row_stats_in_idle_warps`), passed
    among the epilogue's arguments. `shape`: its sizes, each the GEMM's symbolic "m" or "k" or an int;
    `divisibility`: of its row stride and base, in elements."""

    def __init__(self, name, shape, divisibility):
        super().__init__(name)
        self.shape, self.divisibility = shape, divisibility

    def config_key(self):
        # With the source of the code that reads these tensors and its constants, as
        # `ColVecLoadAfterPrimary.config_key` does.
        return (self.shape, self.divisibility, STATS_CHUNKS_PER_LANE, MAX_POLLS, STATS_WARPS_BARRIER,
                ROW_STATS_BARRIER, _source_digest(KernelTensor, _row_stats_of, _store_row_stats, _row_stats,
                                                  _publish_row_stats,
                                                  _setmaxregister_decrease_then_row_stats,
                                                  _row_stats_in_idle_warps))

    def host_fake_arg(self, key, fctx):
        dtype, _ = key
        shape = tuple(getattr(fctx, size) if isinstance(size, str) else size for size in self.shape)
        return make_fake_tensor(dtype, shape, divisibility=self.divisibility, leading_dim=len(shape) - 1)

    def param_fields(self):
        return [(self.name, object, None)]

    def to_params(self, gemm, args):
        return {self.name: getattr(args, self.name)}


# Row statistics in the gate/up GEMM's idle producer warps: 16-byte loads, this many per lane in flight (a row
# of the seed's 768 elements in one round; the warps have 40 registers a thread, QuACK's setmaxnreg).
STATS_CHUNKS_PER_LANE = 3
# Named barriers, past QuACK's (1-8, `NamedBarrierGemm`): the statistics warps of a CTA (all three arrived before
# the CTA counts itself done), and the one of them that lets the epilogue through with the epilogue's warps.
STATS_WARPS_BARRIER, ROW_STATS_BARRIER = 14, 15
# Polls of the count (each an L2 round trip, ~1 µs) before a CTA stops waiting for other CTAs and computes every
# row's statistics itself: the other CTAs may not be resident (a concurrent kernel holding SMs), and the wait
# must not outlast them. At the seed the count is complete in a few µs.
MAX_POLLS = 1024


@cute.jit
def _row_stats_of(x_row: cute.Tensor, d: Int32, eps: Float32, lane: Int32, chunks: cute.Tensor):
    """(mean, 1/std) of one row of x, in every lane of the warp: Σ(x − c) and Σ(x − c)² in fp32 with c the row's
    first element, whose spread about the mean is the row's own, so the difference of squares keeps fp32's
    precision there."""
    c = x_row[0].to(Float32)
    sums = cute.make_rmem_tensor((2,), Float32)
    sums.fill(0.0)
    for start in cutlass.range(0, d, 8 * 32 * STATS_CHUNKS_PER_LANE, unroll=1):
        # All of a round's loads first (their latency overlaps); a chunk past the row's end reads the row's last
        # chunk again and is not counted. d is a multiple of 8 (TMA's rows).
        for j in cutlass.range_constexpr(STATS_CHUNKS_PER_LANE):
            col = start + (j * 32 + lane) * 8
            cute.autovec_copy(cute.local_tile(x_row, (8,), (min(col, d - 8) // 8,)), chunks[None, j])
        for j in cutlass.range_constexpr(STATS_CHUNKS_PER_LANE):
            if start + (j * 32 + lane) * 8 < d:
                centered = chunks[None, j].load().to(Float32) - c
                sums[0] = sums[0] + centered.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
                sums[1] = sums[1] + (centered * centered).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
    for offset in cutlass.range_constexpr(5):
        sums[0] = sums[0] + cute.arch.shuffle_sync_bfly(sums[0], offset=16 >> offset)
        sums[1] = sums[1] + cute.arch.shuffle_sync_bfly(sums[1], offset=16 >> offset)
    shift = sums[0] / d
    return c + shift, cute.math.rsqrt(max(sums[1] / d - shift * shift, Float32(0.0)) + eps)


@cute.jit
def _store_row_stats(x: cute.Tensor, mean: cute.Tensor, rstd: cute.Tensor, eps: Float32, row: Int32, lane: Int32,
                     chunks: cute.Tensor):
    """`_row_stats_of` x's row `row`, stored by lane 0."""
    row_mean, row_rstd = _row_stats_of(x[row, None], cute.size(x, mode=[1]), eps, lane, chunks)
    if lane == 0:
        mean[0, row] = row_mean
        rstd[0, row] = row_rstd


@cute.jit
def _row_stats(x: cute.Tensor, mean: cute.Tensor, rstd: cute.Tensor, counters: cute.Tensor, eps: Float32,
               stats_warp: Int32, stats_warps_per_cta: cutlass.Constexpr[int]):
    """mean and 1/std of x's rows [first, first + n) for this warp, n = ⌈M / all statistics warps⌉, stored by
    lane 0, then one arrival on counters[0] (a gpu-scope release by that lane)."""
    lane = cute.arch.lane_idx()
    grid, block = cute.arch.grid_dim(), cute.arch.block_idx()
    ctas = grid[0] * grid[1] * grid[2]
    cta = block[0] + grid[0] * (block[1] + grid[1] * block[2])
    m = cute.size(x, mode=[0])
    rows_per_warp = (m + ctas * stats_warps_per_cta - 1) // (ctas * stats_warps_per_cta)
    first = (cta * stats_warps_per_cta + stats_warp) * rows_per_warp
    chunks = cute.make_rmem_tensor((8, STATS_CHUNKS_PER_LANE), x.element_type)
    # x may be the output of the kernel this one launched behind (programmatic dependent launch).
    cute.arch.griddepcontrol_wait()
    for r in cutlass.range(rows_per_warp, unroll=1):
        if first + r < m:
            _store_row_stats(x, mean, rstd, eps, first + r, lane, chunks)
    release_add(counters.iterator, lane, 0, 1)


@cute.jit
def _publish_row_stats(x: cute.Tensor, mean: cute.Tensor, rstd: cute.Tensor, counters: cute.Tensor,
                       eps: Float32, stats_warps_per_cta: cutlass.Constexpr[int], ready: NamedBarrier):
    """In one statistics warp of each CTA, once its CTA's statistics warps have all arrived: wait until every
    statistics warp of the grid has, let this CTA's epilogue through `ready`, then count this CTA done on
    counters[1]; the last CTA zeroes both counters for the next call. Done here rather than in the epilogue,
    whose critical path would take the acquiring load's and the atomic's round trips to L2.
    After `MAX_POLLS` polls the warp computes every row itself (the same code, so the same bits as the warps
    responsible for them) and lets the epilogue through: a grid that cannot become resident at once is slow,
    not stuck."""
    lane = cute.arch.lane_idx()
    grid = cute.arch.grid_dim()
    ctas = grid[0] * grid[1] * grid[2]
    expected = ctas * stats_warps_per_cta
    count, polls = Int32(0), Int32(0)
    # Lane 0 acquires; the warp's sync and the barrier pass that on to the epilogue's threads (as QuACK's
    # Semaphore pairs them), whose loads of the statistics follow.
    if lane == 0:
        count = cute.arch.load(counters.iterator, Int32, sem="acquire", scope="gpu")
        while count != expected and polls < MAX_POLLS:
            count = cute.arch.load(counters.iterator, Int32, sem="acquire", scope="gpu")
            polls = polls + 1
    count = cute.arch.shuffle_sync(count, 0)
    if count != expected:
        chunks = cute.make_rmem_tensor((8, STATS_CHUNKS_PER_LANE), x.element_type)
        for row in cutlass.range(cute.size(x, mode=[0]), unroll=1):
            _store_row_stats(x, mean, rstd, eps, row, lane, chunks)
    cute.arch.sync_warp()
    ready.arrive()
    if lane == 0:
        if cute.arch.atomic_add(counters.iterator + 1, Int32(1), sem="relaxed", scope="gpu") == ctas - 1:
            cute.arch.store(counters.iterator, Int32(0), sem="relaxed", scope="gpu")
            cute.arch.store(counters.iterator + 1, Int32(0), sem="relaxed", scope="gpu")


# The GEMM (a `_row_stats_in_idle_warps` class) whose kernel this thread is tracing, if any: QuACK's SM90 kernel
# calls `cute.arch.setmaxregister_decrease` in its producer warps only, and nothing of QuACK's runs in three of
# them after it, so that call is where their statistics code is traced in. The call is wrapped only while one of
# our GEMMs traces (`_row_stats_hook`); the wrapper adds nothing to any other kernel traced meanwhile (a context
# variable, so that threads tracing at once do not mix).
_tracing_row_stats: contextvars.ContextVar = contextvars.ContextVar("_tracing_row_stats", default=None)


def _setmaxregister_decrease_then_row_stats(*args, _decrease=cute.arch.setmaxregister_decrease, **kwargs):
    _decrease(*args, **kwargs)
    gemm = _tracing_row_stats.get()
    if gemm is not None:
        gemm._row_stats_in_producer_warps()


_hook_lock = threading.Lock()
_hook_users = 0


@contextlib.contextmanager
def _row_stats_hook():
    """`cute.arch.setmaxregister_decrease` wrapped (`_setmaxregister_decrease_then_row_stats`) for the duration:
    while one of our row-statistics GEMMs traces its kernel, restored when the last such trace ends."""
    global _hook_users
    with _hook_lock:
        if _hook_users == 0:
            cute.arch.setmaxregister_decrease = _setmaxregister_decrease_then_row_stats
        _hook_users += 1
    try:
        yield
    finally:
        with _hook_lock:
            _hook_users -= 1
            if _hook_users == 0:
                cute.arch.setmaxregister_decrease = _setmaxregister_decrease_then_row_stats.__kwdefaults__["_decrease"]


@functools.cache
def _row_stats_in_idle_warps(gemm_cls):
    """`gemm_cls` computing LayerNorm's row statistics itself, in the three warps of its producer warpgroup that
    QuACK leaves idle (the fourth issues the TMA loads), while its main loop runs: the rows are split among all
    CTAs' such warps, each warp's mean and 1/std stored to the `mean`/`rstd` tensors and counted in
    `ln_counters[0]`; the first of them in each CTA then waits for all of them and lets the CTA's epilogue load
    the statistics (`_publish_row_stats`, through named barrier `ROW_STATS_BARRIER`).
    That wait spans CTAs, so it is meant for grids whose CTAs are all resident at once and run one tile each
    (`computes_row_stats`: the tiles fit in one wave of QuACK's persistent grid; cooperative configs); where
    they cannot all be (a concurrent kernel holding SMs), the wait gives up after `MAX_POLLS` and the CTA
    computes the statistics itself. The counters (`row_stats_counters`) are zero between calls: the last CTA done
    (counted in `ln_counters[1]`) zeroes both, and the next call's warps, waiting for the kernel before them,
    count only after this grid ended.
    The warps start once QuACK's `setmaxregister_decrease` gives the producers their 40 registers (see
    `_tracing_row_stats`)."""
    class GemmWithRowStats(gemm_cls):
        def epi_get_smem_tensors(self, params, storage):
            assert not self.pingpong, "statistics in idle warps: cooperative configs only (one epilogue a CTA)"
            self._row_stats_params = params  # for the producer warps, traced after this
            return super().epi_get_smem_tensors(params, storage)

        def _stats_warps(self):
            return 4 - self.num_ab_load_warps

        def _stats_ready(self):
            # The epilogue's warps and the one statistics warp that lets them through.
            return NamedBarrier(barrier_id=ROW_STATS_BARRIER, num_threads=(self.num_epi_warps + 1) * 32)

        @cute.jit
        def _row_stats_in_producer_warps(self):
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            first_stats_warp = self.ab_load_warp_id + self.num_ab_load_warps
            if warp >= first_stats_warp:
                params = self._row_stats_params
                _row_stats(params.ln_x, params.mean, params.rstd, params.ln_counters, params.ln_eps,
                           warp - first_stats_warp, self._stats_warps())
                # The CTA counts itself done only after all its statistics warps arrived, so that the last CTA
                # done zeroes the counters after every arrival.
                all_arrived = NamedBarrier(barrier_id=STATS_WARPS_BARRIER, num_threads=self._stats_warps() * 32)
                if warp == first_stats_warp:
                    all_arrived.arrive_and_wait()
                    _publish_row_stats(params.ln_x, params.mean, params.rstd, params.ln_counters, params.ln_eps,
                                       self._stats_warps(), self._stats_ready())
                else:
                    all_arrived.arrive()

        def kernel(self, *args, **kwargs):
            launcher = super().kernel(*args, **kwargs)
            trace_and_launch = launcher.launch

            def launch(*launch_args, **launch_kwargs):
                tracing = _tracing_row_stats.set(self)
                try:
                    with _row_stats_hook():
                        return trace_and_launch(*launch_args, **launch_kwargs)
                finally:
                    _tracing_row_stats.reset(tracing)
            launcher.launch = launch
            return launcher

        @cute.jit
        def epi_begin(self, params, epi_smem_tensors, epi_tile, tiled_copy_t2r, tiled_copy_r2s, tile_coord_mnkl,
                      varlen_manager, epilogue_barrier, tidx, tRS_rD_layout=None):
            self._stats_ready().arrive_and_wait()
            cute.arch.griddepcontrol_launch_dependents()
            return gemm_cls.epi_begin(self, params, epi_smem_tensors, epi_tile, tiled_copy_t2r, tiled_copy_r2s,
                                      tile_coord_mnkl, varlen_manager, epilogue_barrier, tidx, tRS_rD_layout)
    GemmWithRowStats.__qualname__ = GemmWithRowStats.__name__ = f"{gemm_cls.__name__}_WithRowStats"
    return GemmWithRowStats


class _EpiModWithRowStats(EpiMod):
    """An epilogue whose GEMM kernels compute the row statistics themselves (`_row_stats_in_idle_warps`)."""

    def _mint(self, *key):
        return _row_stats_in_idle_warps(super()._mint(*key))


def _folded_ln_geglu(gelu, row_stats=False):
    # The statistics are per row (a column vector over M), the fold's two rows per column; named explicitly so
    # that M == 2·d_ff cannot make QuACK's shape inference ambiguous.
    def folded_ln_geglu(acc, mean, rstd, colsum, shift):
        # acc pairs adjacent columns (gate, up): the weights' rows are interleaved.
        gate, up = unpack((acc - colsum * mean) * rstd + shift)
        return {"h": gelu(gate) * up}
    ops = {"colsum": RowVecLoad("colsum"), "shift": RowVecLoad("shift")}
    if row_stats:
        return _EpiModWithRowStats(folded_ln_geglu, outputs=("h",), mode="acc_pair", extra_ops=(
            KernelTensor("ln_x", ("m", "k"), 8), KernelTensor("ln_counters", (2,), 1), Scalar("ln_eps")), ops={
            "mean": ColVecLoad("mean"), "rstd": ColVecLoad("rstd"), **ops})
    stats_load, epi_mod = (ColVecLoadAfterPrimary, _EpiModWaitingInEpilogue) if WAIT_IN_EPILOGUE else (
        ColVecLoad, EpiMod)
    return epi_mod(folded_ln_geglu, outputs=("h",), mode="acc_pair", ops={
        "mean": stats_load("mean"), "rstd": stats_load("rstd"), **ops})


# Module globals, so that QuACK's compile cache can find them again by import (its `module_locator`).
FOLDED_LN_GEGLU_ERF = _folded_ln_geglu(gelu_erf)
FOLDED_LN_GEGLU_TANH = _folded_ln_geglu(gelu_tanh_approx)
FOLDED_LN_GEGLU_ERF_ROW_STATS = _folded_ln_geglu(gelu_erf, row_stats=True)
FOLDED_LN_GEGLU_TANH_ROW_STATS = _folded_ln_geglu(gelu_tanh_approx, row_stats=True)


def gate_up(x: torch.Tensor, stats: torch.Tensor, folded: torch.Tensor, fold: torch.Tensor, h: torch.Tensor,
            approximate: str, shape_class: str, row_stats: tuple[torch.Tensor, float] | None = None) -> None:
    """h ← the GEGLU of LayerNorm(x)'s gate and up projections, from x [M, d], stats [2, M] (mean; 1/std),
    folded [2·ff, d] and fold [2, 2·ff] (see the module docstring). With `row_stats` (where
    `computes_row_stats`: counters from `row_stats_counters`, and eps), the GEMM computes the statistics into
    `stats` itself."""
    # QuACK loads its vectors from 16-byte boundaries: the statistics' second row starts on one only when M is a
    # multiple of 4 (the fold's, at 2·d_ff floats, always does); otherwise it is copied (one small kernel), which
    # a GEMM computing the statistics could not write through (`computes_row_stats` asks for such an M).
    rstd = stats[1:2] if stats.shape[1] % 4 == 0 else stats[1:2].clone()
    kwargs = dict(mean=stats[0:1], rstd=rstd, colsum=fold[0:1], shift=fold[1:2])
    if row_stats is None:
        epilogue = FOLDED_LN_GEGLU_TANH if approximate == "tanh" else FOLDED_LN_GEGLU_ERF
    else:
        assert stats.shape[1] % 4 == 0, "a GEMM computing the statistics writes 1/std in place: M % 4 == 0 only"
        epilogue = FOLDED_LN_GEGLU_TANH_ROW_STATS if approximate == "tanh" else FOLDED_LN_GEGLU_ERF_ROW_STATS
        counters, eps = row_stats
        kwargs.update(ln_x=x, ln_counters=counters, ln_eps=float(eps))
    epilogue(x, folded.T, out={"h": h}, store_d=False, config=GATE_UP_CONFIGS[shape_class], tuned=False, **kwargs)


# Counter pairs of `_row_stats_in_idle_warps`, carved from one zeroed block per device (made outside any graph
# capture): one pair per stream for eager calls, which a stream runs one after another, and a pair of its own
# for each call captured into a CUDA graph, so that graphs replayed at once never share one. 16384 pairs (128 KB)
# cover a server's captures (batch sizes × layers); past them, captured calls take the statistics kernel.
COUNTER_PAIRS = 16384
_counter_blocks: dict[int, torch.Tensor] = {}
_counters_used: dict[int, int] = {}
_stream_counters: dict[tuple[int, int], torch.Tensor] = {}


def row_stats_counters(device: torch.device) -> torch.Tensor | None:
    """Two int32 counters, zero, for one gate/up launch computing the statistics on `device`'s current stream;
    None where there are none to give (the first call on the device is being captured, or captures took them
    all): the statistics kernel runs then."""
    index = _device_index(device)
    capturing = torch.cuda.is_current_stream_capturing()
    if index not in _counter_blocks:
        if capturing:
            return None
        with torch.inference_mode(False):  # a plain tensor, whatever mode the first call runs in
            _counter_blocks[index] = torch.zeros(2 * COUNTER_PAIRS, dtype=torch.int32, device=device)
        _counters_used[index] = 0
        torch.cuda.synchronize(device)  # zero before any stream uses it
    stream = torch.cuda.current_stream(device).cuda_stream
    if not capturing and (index, stream) in _stream_counters:
        return _stream_counters[index, stream]
    if _counters_used[index] == COUNTER_PAIRS:
        return None
    used = _counters_used[index]
    pair = _counter_blocks[index][2 * used:2 * used + 2]
    _counters_used[index] = used + 1
    if not capturing:
        _stream_counters[index, stream] = pair
    return pair


# Rows of x (in elements) one statistics warp may take before its loads outlast gate/up's main loop; the seed
# gives each 3 rows of 768.
ROW_STATS_ELEMENTS_PER_WARP = 4096


def computes_row_stats(m: int, d: int, ff: int, shape_class: str, device: torch.device) -> bool:
    """Whether gate/up computes the statistics itself (`_row_stats_in_idle_warps`): written against QuACK 0.6.5's
    kernel (as `WAIT_IN_EPILOGUE`), in the small class, where its tiles fit in one wave, its three idle warps per
    CTA have few rows each, and M is a multiple of 4 (see `gate_up`); cooperative configs only (each CTA's
    epilogue counts itself past its wait once)."""
    if not (WAIT_IN_EPILOGUE and shape_class == "small" and m % 4 == 0):
        return False
    c = GATE_UP_CONFIGS[shape_class]
    cluster = c.cluster_m * c.cluster_n
    clusters = cdiv(m, c.tile_m * c.cluster_m) * cdiv(2 * ff, c.tile_n * c.cluster_n)
    return (not c.pingpong and clusters <= _max_active_clusters(cluster, device)
            and cdiv(m, 3 * clusters * cluster) * d <= ROW_STATS_ELEMENTS_PER_WARP)


def _device_index(device: torch.device) -> int:
    return torch.cuda.current_device() if device.index is None else device.index


def _max_active_clusters(cluster_size: int, device: torch.device) -> int:
    """How many clusters of `cluster_size` CTAs of QuACK's SM90 GEMM are resident on `device` at once."""
    return _max_active_clusters_on(cluster_size, _device_index(device))


@functools.cache
def _max_active_clusters_on(cluster_size: int, device_index: int) -> int:
    return get_max_active_clusters(cluster_size, device_capacity=(9, 0), device_id=device_index)


def down_config(m: int, d: int, shape_class: str, device: torch.device) -> GemmConfig:
    """The class's config, or in the small class `DOWN_IN_ONE_WAVE` where all its clusters are resident at once."""
    if shape_class == "small":
        c = DOWN_IN_ONE_WAVE
        clusters = cdiv(m, c.tile_m * c.cluster_m) * cdiv(d, c.tile_n * c.cluster_n)
        if clusters <= _max_active_clusters(c.cluster_m * c.cluster_n, device):
            return c
    return DOWN_CONFIGS[shape_class]


def down(h: torch.Tensor, down_weight: torch.Tensor, down_bias: torch.Tensor | None, x: torch.Tensor,
         y: torch.Tensor, shape_class: str) -> None:
    """y ← x + h @ down_weightᵀ + down_bias (contiguous, on a 16-byte boundary)."""
    if down_bias is not None and down_bias.dtype == torch.float64:  # QuACK's vectors are 16- or 32-bit floats
        down_bias = down_bias.float()
    # gemm_tuned's undecorated function: the GEMM at an explicit config, without the autotuner around it.
    gemm_tuned.fn(h, down_weight.T, y, C=x, bias=down_bias, config=down_config(*y.shape, shape_class, y.device))
