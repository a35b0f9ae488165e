"""Triton kernels of the gated-MLP block (inference: bf16/fp16 on SM90; fp32/fp16 under TRITON_INTERPRET=1 for
the CPU tests), their launchers and the launch-config table.

Up to three kernels per call:
  S. `_stats_kernel` (skipped when the gate/up config has `stats_in_loop` and there is no residual): per row,
     h = round(x + residual) (stored: the op's residual_out) and its statistics in fp32, exactly in two passes
     over the row held in registers: rstd (and, for "layer", the mean), 8 bytes a row.
  A. `_gate_up_kernel`: one GEMM h @ W'ᵀ on the prepared weights (`weights.py`: norm scale folded in, gate and
     up rows interleaved), so both operands go from TMA into shared memory into the tensor cores untouched;
     the epilogue applies rstd (and the mean correction), the biases, act(g)·u in fp32, rounds once and
     stores a [M, d_ff]. For small M (`swap_ab`) the product runs transposed, W'·hᵀ, so that the weight tile
     takes wgmma's 64-row side and the few token rows (padded to 16 by TMA's zero fill) its narrow side.
     Nothing else reads the h tile that TMA brings in: Triton 3.6's pipeliner gives a wgmma operand that is
     also read from registers one shared-memory buffer fewer than the async wgmma in flight needs, a race
     (see `geglu_kernels`' docstring and tests/test_fused_pre_norm_geglu.py's test of the compiled kernel's
     buffers).
     So with `stats_in_loop` (residual None only) the statistics come from a second, plain pointer load of the
     same x block in the K loop (from L2), never from the TMA tile; the one-pass variance it computes for
     "layer" loses precision when |mean|/std is large, which is why the statistics kernel is the default.
  B. `_down_kernel`: out = a @ Wdᵀ (+ bd). When the output has too few tiles to fill the GPU (decode: d_model /
     BLOCK_N tiles), K is split across programs that each write an fp32 partial; the last program to finish a
     tile (an acq_rel atomic counter, zeroed by program 0 of kernel A: no memset launch) sums the partials in
     split order: the same bits every run.
Where the gate/up config asks for it (`dependent_launch`) and not interpreted, the kernels launch as
programmatic dependent launches (Hopper's PDL), as the GEGLU op's do: S waits for the kernel before the op and
then lets A launch; A waits for S before reading what S wrote (h: before its main loop when there is a
residual; otherwise only the statistics, in its epilogue) and lets B launch at its start or after its stores;
B waits for A before reading a. A kernel that is the op's first (A with `stats_in_loop`) waits first.

Operands are read through TMA descriptors: rows of 16 bytes' multiples (d_model and d_ff multiples of 8), a
16-byte-aligned base (`tma_ready`); other widths take the op's recorded fallback.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from sk import settings
from sk.ops.act_and_mul import activate
from sk.ops.gated_mlp.common import (  # noqa: F401 (the kernels call the _-named helpers by name)
    TMA_ALIGN, TileConfig, _split_k_sum, _tile_coords, _tile_product, align, cdiv, descriptor, next_power_of_2,
    sm_count, tma_ready,
)


# ----------------------------------------------------------------------------------------------- kernels

@triton.jit(do_not_specialize=["n_rows", "eps"])
def _stats_kernel(
    x_ptr, r_ptr, h_ptr, stats_ptr, n_rows, d, eps,
    D_ALIGN: tl.constexpr, HAS_RESIDUAL: tl.constexpr, LAYER: tl.constexpr, PDL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # stats is [2, n_rows] fp32: mean (0 unless LAYER), then rstd.
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    row_stride = d // D_ALIGN * D_ALIGN  # == d, written so the compiler knows its alignment (wide loads)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)[None, :]
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < d)
    offs = rows.to(tl.int64)[:, None] * row_stride + cols
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + offs, mask=mask, other=0.0)
        hq = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)  # rounded, as the engines do
        tl.store(h_ptr + offs, hq, mask=mask)
        h = hq.to(tl.float32)
    else:
        h = x.to(tl.float32)
    if LAYER:
        mean = tl.sum(h, axis=1) / d
        centered = tl.where(mask, h - mean[:, None], 0.0)
        var = tl.sum(centered * centered, axis=1) / d
    else:
        mean = tl.zeros((BLOCK_M,), dtype=tl.float32)
        var = tl.sum(h * h, axis=1) / d
    tl.store(stats_ptr + rows, mean, mask=row_ok)
    tl.store(stats_ptr + n_rows + rows, tl.rsqrt(var + eps), mask=row_ok)


@triton.jit(do_not_specialize=["n_rows", "eps", "n_arrivals"])
def _gate_up_kernel(
    h_desc, w_desc, h_ptr, stats_ptr, colsum_ptr, shift_ptr, a_ptr, arrivals_ptr, n_rows, d, ff, eps, n_arrivals,
    D_ALIGN: tl.constexpr, FF_ALIGN: tl.constexpr, K_BLOCKS: tl.constexpr, LAYER: tl.constexpr,
    HAS_SHIFT: tl.constexpr, ACT: tl.constexpr, SWAP_AB: tl.constexpr, STATS_IN_LOOP: tl.constexpr,
    PDL: tl.constexpr, WAIT_FIRST: tl.constexpr, DOWN_AT_START: tl.constexpr, ARRIVALS_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # BLOCK_N counts weight rows: a tile computes BLOCK_N / 2 columns of a (gate and up rows interleaved).
    # TMA zero-fills past every edge (rows past n_rows, k past d_model, weight rows past 2·d_ff): no masks in
    # the loop; the stores are masked.
    if PDL and WAIT_FIRST:
        gdc_wait()
    if PDL and DOWN_AT_START:
        gdc_launch_dependents()
    if ARRIVALS_BLOCK > 0:  # the down kernel's split-K arrival counters; it reads them after this grid ends
        if tl.program_id(0) == 0:
            counters = tl.arange(0, ARRIVALS_BLOCK)
            tl.store(arrivals_ptr + counters, tl.zeros((ARRIVALS_BLOCK,), tl.int32), mask=counters < n_arrivals)
    HALF: tl.constexpr = BLOCK_N // 2
    num_m, num_n = tl.cdiv(n_rows, BLOCK_M), tl.cdiv(2 * ff, BLOCK_N)
    pid_m, pid_n = _tile_coords(tl.program_id(0), num_m, num_n, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < n_rows
    if STATS_IN_LOOP:
        # The statistics from a second, plain load of the x block (never from the TMA tile: see the docstring).
        row_stride = d // D_ALIGN * D_ALIGN
        acc = tl.zeros((BLOCK_N, BLOCK_M) if SWAP_AB else (BLOCK_M, BLOCK_N), dtype=tl.float32)
        s1 = tl.zeros((BLOCK_M,), dtype=tl.float32)
        s2 = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k in tl.range(K_BLOCKS, loop_unroll_factor=1):
            a = h_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
            b = w_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
            if SWAP_AB:
                acc = tl.dot(b, a.T, acc)
            else:
                acc = tl.dot(a, b.T, acc)
            k_offs = k * BLOCK_K + tl.arange(0, BLOCK_K)
            xs = tl.load(h_ptr + offs_m.to(tl.int64)[:, None] * row_stride + k_offs[None, :],
                         mask=row_ok[:, None] & (k_offs < d)[None, :], other=0.0).to(tl.float32)
            s1 += tl.sum(xs, axis=1)
            s2 += tl.sum(xs * xs, axis=1)
        if SWAP_AB:
            acc = acc.T
        if LAYER:
            mean = s1 / d
            rstd = tl.rsqrt(tl.maximum(s2 / d - mean * mean, 0.0) + eps)
        else:
            mean = s1 * 0.0
            rstd = tl.rsqrt(s2 / d + eps)
    else:
        acc = _tile_product(h_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, 0, K_BLOCKS, SWAP_AB,
                            BLOCK_M, BLOCK_N, BLOCK_K)
        if PDL and not WAIT_FIRST:
            gdc_wait()  # the statistics kernel has finished: its rstd (and mean) are in memory
        mean = tl.load(stats_ptr + offs_m, mask=row_ok, other=0.0)
        rstd = tl.load(stats_ptr + n_rows + offs_m, mask=row_ok, other=0.0)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols_ok = cols < 2 * ff
    if LAYER:
        acc -= mean[:, None] * tl.load(colsum_ptr + cols, mask=cols_ok, other=0.0)[None, :]
    acc = acc * rstd[:, None]
    if HAS_SHIFT:
        acc += tl.load(shift_ptr + cols, mask=cols_ok, other=0.0)[None, :]
    g, u = tl.split(tl.reshape(acc, (BLOCK_M, HALF, 2)))  # even columns gate, odd up
    out = (activate(g, ACT) * u).to(a_ptr.dtype.element_ty)
    ff_stride = ff // FF_ALIGN * FF_ALIGN  # == ff (alignment known to the compiler: wide stores)
    out_cols = pid_n * HALF + tl.arange(0, HALF)
    tl.store(a_ptr + offs_m.to(tl.int64)[:, None] * ff_stride + out_cols[None, :], out,
             mask=row_ok[:, None] & (out_cols < ff)[None, :])
    if PDL and not DOWN_AT_START:
        gdc_launch_dependents()


@triton.jit(do_not_specialize=["n_rows"])
def _down_kernel(
    a_desc, wd_desc, bd_ptr, y_desc, partial_ptr, arrivals_ptr, n_rows, d,
    K_BLOCKS_PER_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, SWAP_AB: tl.constexpr,
    PDL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    RESET_ARRIVALS: tl.constexpr = False,
):
    # RESET_ARRIVALS (`linear_kernels`): the tile's last program zeroes its split-K counter again, so that a
    # persistent, once-zeroed counter buffer serves every call without a memset launch.
    if PDL:
        gdc_wait()  # everything this reads (a, the zeroed counters) comes from the gate/up kernel
    tile = tl.program_id(0)
    pid_m, pid_n = _tile_coords(tile, tl.cdiv(n_rows, BLOCK_M), tl.cdiv(d, BLOCK_N), GROUP_M)
    k_first = tl.program_id(1) * K_BLOCKS_PER_SPLIT
    acc = _tile_product(a_desc, wd_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, k_first, K_BLOCKS_PER_SPLIT, SWAP_AB,
                        BLOCK_M, BLOCK_N, BLOCK_K)
    if SPLIT_K > 1:
        acc, last = _split_k_sum(acc, partial_ptr, arrivals_ptr, tile, pid_m, pid_n, n_rows, d, SPLIT_K, BLOCK_M,
                                 BLOCK_N)
        if last:
            if RESET_ARRIVALS:
                tl.store(arrivals_ptr + tile, 0)  # every split of this tile has arrived: nobody reads it again
            _down_epilogue(acc, bd_ptr, y_desc, pid_m, pid_n, d, HAS_BIAS, BLOCK_M, BLOCK_N)
    else:
        _down_epilogue(acc, bd_ptr, y_desc, pid_m, pid_n, d, HAS_BIAS, BLOCK_M, BLOCK_N)


@triton.jit
def _down_epilogue(acc, bd_ptr, y_desc, pid_m, pid_n, d, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    if HAS_BIAS:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc += tl.load(bd_ptr + offs_n, mask=offs_n < d, other=0.0).to(tl.float32)[None, :]
    y_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(y_desc.dtype))


# ----------------------------------------------------------------------------------------------- launch configs

@dataclasses.dataclass(frozen=True)
class GemmConfig(TileConfig):
    """`TileConfig` (tile shape and launch of one GEMM kernel, `source`) with this op's meanings and knobs:

    block_n: weight rows per tile (gate/up: gate and up interleaved, so BLOCK_N / 2 output columns).
    split_k (down only): 1 none, n > 1 exactly n (fewer if K has fewer blocks), 0 automatic: enough splits
        for `split_waves` waves of programs on the GPU's SMs, each split at least 2 K blocks.
    stats_in_loop (gate/up only): without a residual, no statistics kernel: gate/up sums the row statistics
        from its own K loop (see the module docstring).
    """
    split_waves: float = 2.0
    stats_in_loop: bool = False


# Shape classes by the number of rows M (the tokens of a step); the table holds one (gate_up, down) pair per
# class, `TUNED` overrides it for a (class, d_model, d_ff). Entries chosen by a sweep on the H200
# (benchmarks/bench_gated_mlp.py --sweep) name its committed result in `source`; the others are Hopper starting
# points, "untuned". Shared memory per stage is (block_m + block_n) · block_k · 2 bytes, at most ~220 KB
# for all stages.
# - m8 / m32 (decode): weight streaming. Products transposed (the weight tile is wgmma's M side, tokens padded
#   to 16/32), 128 weight rows × 128 of K a stage, 4 stages (~150 KB in flight per SM, far above what an SM
#   needs to saturate its share of HBM); the down GEMM split over K to ≥ 2 waves of programs (its d_model/128
#   tiles are a quarter of the SMs); gate/up lets the down kernel launch at its start. Gate/up tiles are
#   halved (64 weight rows) when 128-row tiles would leave SMs idle (`choose_configs`).
# - m128: 64-row tiles, no swap; down split to fill the GPU.
# - m1024, large (prefill): 128 × 128 / 128 × 256 tiles, 8 warps, grouped row order (GROUP_M 8).
M_CLASSES = ((8, "m8"), (32, "m32"), (128, "m128"), (1024, "m1024"))
# Rows above which the op composes cuBLAS GEMMs with our norm/activation kernels instead (norm "layer" excepted):
# the fused kernels lose from M=128 on (0.60-0.86x at M=128, 0.91-1.05x in prefill: results/h200/gated_mlp/README.md).
FUSED_MAX_M = 32
# Above LARGE_MLP (d_model * d_ff, Gemma-2B's 2048 * 16384) the fused kernels stop at FUSED_MAX_M_LARGE rows: at
# Llama-3-8B's 4096 * 14336 the composed route was faster at M = 32 in all four H200 runs (1-2.5 %), while at
# Llama-3.2-1B and Gemma-2B the fused kernels won there by 3-10 % (results/h200/gated_mlp/README.md, 2026-12-04).
LARGE_MLP = 2048 * 16384
FUSED_MAX_M_LARGE = 8


def fused_max_m(d: int, ff: int) -> int:
    """Rows up to which the op runs its fused kernels for a d x ff block (norms "rms" and "gemma_rms")."""
    return FUSED_MAX_M_LARGE if d * ff > LARGE_MLP else FUSED_MAX_M


_DECODE_SWEEP = "results/h200/gated_mlp/2026-12-02/sweep-decode/bench_gated_mlp_sweep.json"
GATE_UP_CONFIGS = {
    "m8": GemmConfig(16, 128, 128, 4, 3, swap_ab=True, dependent_launch="at_start", source=_DECODE_SWEEP),
    "m32": GemmConfig(32, 128, 128, 4, 4, swap_ab=True, dependent_launch="at_start"),
    "m128": GemmConfig(64, 128, 64, 4, 4),
    "m1024": GemmConfig(128, 128, 64, 8, 4),
    "large": GemmConfig(128, 256, 64, 8, 3),
}
DOWN_CONFIGS = {
    "m8": GemmConfig(16, 128, 128, 4, 3, split_k=0, split_waves=4.0, swap_ab=True, source=_DECODE_SWEEP),
    "m32": GemmConfig(32, 64, 128, 4, 4, split_k=0, split_waves=1.0, swap_ab=True, source=_DECODE_SWEEP),
    "m128": GemmConfig(64, 128, 64, 4, 4, split_k=0),
    "m1024": GemmConfig(128, 128, 64, 8, 4, split_k=0),
    "large": GemmConfig(128, 256, 64, 8, 3),
}
# (class, d_model, d_ff) -> (gate_up, down), each with `source` naming its committed sweep result. Empty until
# the H200 sweep.
TUNED: dict[tuple[str, int, int], tuple[GemmConfig, GemmConfig]] = {}
MAX_SPLIT_K = 16


def shape_class(m: int) -> str:
    return next((name for bound, name in M_CLASSES if m <= bound), "large")


def fit_configs(gate_up: GemmConfig, down: GemmConfig, m: int, d: int, ff: int, sms: int
                ) -> tuple[GemmConfig, GemmConfig]:
    """Both configs fitted to the problem: blocks no larger than it, down's automatic split resolved."""
    return gate_up.fitted(m, 2 * ff, d), fit_split(down, m, d, ff, sms)


def fit_split(config: GemmConfig, m: int, n: int, k: int, sms: int) -> GemmConfig:
    """A split-K GEMM's config (m rows, n outputs, k deep) fitted to the problem, its automatic split resolved."""
    config = config.fitted(m, n, k)
    k_blocks = cdiv(k, config.block_k)
    split = config.split_k
    if split == 0:
        tiles = cdiv(m, config.block_m) * cdiv(n, config.block_n)
        split = min(MAX_SPLIT_K, max(1, k_blocks // 2), cdiv(int(config.split_waves * sms), tiles))
    split = max(1, min(split, k_blocks))
    split = cdiv(k_blocks, cdiv(k_blocks, split))  # no empty splits
    return dataclasses.replace(config, split_k=split)


@functools.lru_cache(maxsize=512)
def choose_configs(m: int, d: int, ff: int, sms: int) -> tuple[GemmConfig, GemmConfig]:
    """(gate_up, down) configs for m rows of (d_model d, d_ff ff) on a GPU of `sms` SMs."""
    cls = shape_class(m)
    gate_up, down = TUNED.get((cls, d, ff)) or (GATE_UP_CONFIGS[cls], DOWN_CONFIGS[cls])
    if gate_up.swap_ab and (cls, d, ff) not in TUNED:
        # Decode: fewer weight rows per tile while the gate/up grid would leave SMs idle (64: wgmma's M side).
        block_n = gate_up.block_n
        while block_n > 64 and cdiv(2 * ff, block_n) < sms:
            block_n //= 2
        gate_up = dataclasses.replace(gate_up, block_n=block_n)
    return fit_configs(gate_up, down, m, d, ff, sms)


# ----------------------------------------------------------------------------------------------- launchers

def pdl_on() -> bool:
    """Programmatic dependent launch: on where the config asks, except in the interpreter (no inline PTX) or
    with SK_GATED_MLP_PDL=0."""
    return settings.get("gated_mlp_pdl") and not settings.get("triton_interpret")


def forward_kernels(
    x: torch.Tensor, residual: Optional[torch.Tensor], gate_up_weight: torch.Tensor, colsum: Optional[torch.Tensor],
    shift: Optional[torch.Tensor], down_weight: torch.Tensor, down_bias: Optional[torch.Tensor], eps: float,
    norm: str, activation: str, configs: Optional[tuple[GemmConfig, GemmConfig]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the kernels on 2-D contiguous, TMA-ready tensors: x and residual [M, d_model] (residual may be
    None), the prepared gate/up weight [2·d_ff, d_model] with its fp32 vectors (`weights.fold`), down_weight
    [d_model, d_ff] in x's dtype, down_bias [d_model] or None. Returns (out, h); h is empty without a residual
    (it is x). `configs` (already fitted, e.g. `fit_configs`) overrides the table: the benchmark's sweep and
    the tests use it. A documented-internal entry point: no argument checks, no coverage decision."""
    m, d = x.shape
    ff = down_weight.shape[1]
    dtype, dev = x.dtype, x.device
    out = torch.empty((m, d), dtype=dtype, device=dev)
    h = torch.empty((m, d) if residual is not None else 0, dtype=dtype, device=dev)
    if m == 0:
        return out, h
    gate_up, down = configs or choose_configs(m, d, ff, sm_count(dev))
    layer = norm == "layer"
    in_loop = gate_up.stats_in_loop and residual is None
    pdl = pdl_on() and gate_up.dependent_launch != "none"
    a = torch.empty((m, ff), dtype=dtype, device=dev)
    tiles = cdiv(m, down.block_m) * cdiv(d, down.block_n)
    if down.split_k > 1:
        scratch = torch.empty(down.split_k * m * d + tiles, dtype=torch.float32, device=dev)
        partial, arrivals = scratch[: down.split_k * m * d], scratch[down.split_k * m * d:].view(torch.int32)
    else:
        partial, arrivals = out, out  # unread without a split
    hx = x if residual is None else h  # what the gate/up GEMM reads
    stats = x if in_loop else torch.empty((2, m), dtype=torch.float32, device=dev)  # unread in the loop variant

    if not in_loop:
        block_d = next_power_of_2(d)
        rows_per_program = max(1, min(16, 2048 // block_d))
        _stats_kernel[(cdiv(m, rows_per_program),)](
            x, residual if residual is not None else x, h, stats, m, d, eps,
            D_ALIGN=align(d), HAS_RESIDUAL=residual is not None, LAYER=layer, PDL=pdl,
            BLOCK_M=rows_per_program, BLOCK_D=block_d,
            num_warps=min(16, max(1, rows_per_program * block_d // 512)), launch_pdl=pdl,
        )

    c = gate_up
    _gate_up_kernel[(cdiv(m, c.block_m) * cdiv(2 * ff, c.block_n),)](
        descriptor(hx, [c.block_m, c.block_k]), descriptor(gate_up_weight, [c.block_n, c.block_k]), hx, stats,
        colsum if colsum is not None else stats, shift if shift is not None else stats, a, arrivals,
        m, d, ff, eps, tiles,
        D_ALIGN=align(d), FF_ALIGN=align(ff), K_BLOCKS=cdiv(d, c.block_k), LAYER=layer,
        HAS_SHIFT=shift is not None, ACT=activation, SWAP_AB=c.swap_ab, STATS_IN_LOOP=in_loop, PDL=pdl,
        WAIT_FIRST=in_loop or residual is not None, DOWN_AT_START=c.dependent_launch == "at_start",
        ARRIVALS_BLOCK=max(16, next_power_of_2(tiles)) if down.split_k > 1 else 0,
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
        num_warps=c.num_warps, num_stages=c.num_stages, launch_pdl=pdl,
    )

    c = down
    _down_kernel[(tiles, c.split_k)](
        descriptor(a, [c.block_m, c.block_k]), descriptor(down_weight, [c.block_n, c.block_k]), down_bias,
        descriptor(out, [c.block_m, c.block_n]), partial, arrivals, m, d,
        K_BLOCKS_PER_SPLIT=cdiv(cdiv(ff, c.block_k), c.split_k), HAS_BIAS=down_bias is not None,
        SPLIT_K=c.split_k, SWAP_AB=c.swap_ab, PDL=pdl,
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
        num_warps=c.num_warps, num_stages=c.num_stages, launch_pdl=pdl,
    )
    return out, h


# ----------------------------------------------------------------------------------------------- linear

# Rows up to which `sk.ops.linear` runs the split-K kernel (the down kernel on its own); above, cuBLAS.
LINEAR_MAX_M = 32
# Split-K arrival counters, zeroed once and re-zeroed by the kernel itself (RESET_ARRIVALS). Eager calls share one
# buffer per (device, stream): a stream runs its kernels one after the other. A call captured into a CUDA graph
# takes a slice of its own from a per-device block zeroed outside any capture, so that graphs replayed at once on
# several streams, or beside eager work on their capture stream, never share a counter. 2048 counters cover one
# call's output tiles up to N = 131072 at 64-column tiles; the capture block's 1 << 20 (4 MiB) cover a server's
# captures (batch sizes up to LINEAR_MAX_M × layers × projections). A larger call, a capture before any eager
# call on the device, or one past the block zeroes counters of its own (a memset in the graph: correct, slower).
LINEAR_COUNTERS = 2048
CAPTURE_COUNTERS = 1 << 20
_linear_counters: dict[tuple[torch.device, int], torch.Tensor] = {}
_capture_blocks: dict[torch.device, torch.Tensor] = {}
_capture_used: dict[torch.device, int] = {}


def linear_config(m: int, n: int, k: int, sms: int) -> GemmConfig:
    """The split-K config of `sk.ops.linear` for m rows of an [n, k] weight: the down GEMM's decode class
    (`DOWN_CONFIGS`, its K split resolved to fill the GPU)."""
    return fit_split(DOWN_CONFIGS[shape_class(m)], m, n, k, sms)


def _stream_key(device: torch.device) -> tuple[torch.device, int]:
    return device, (torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)


def linear_counters(device: torch.device) -> Optional[torch.Tensor]:
    """The persistent split-K counters of `linear_kernels`' eager calls on `device`'s current stream (None
    before its first split call there): zero between calls."""
    return _linear_counters.get(_stream_key(device))


def capture_counters(device: torch.device) -> Optional[tuple[torch.Tensor, int]]:
    """The block the captured calls' split-K counters are carved from on `device` and how many of them are taken
    (None before the first eager split call there): zero outside the replays."""
    return (_capture_blocks[device], _capture_used[device]) if device in _capture_blocks else None


def split_counters(device: torch.device, tiles: int, captured: bool) -> torch.Tensor:
    """Zeroed split-K counters for one call with `tiles` output tiles: eager, the current stream's persistent
    buffer; `captured` (into a CUDA graph), a slice of the device's capture block that no other call reads (both
    made outside any capture, and left zeroed by the kernels); else a zeroed tensor of the call's own."""
    if not captured:
        if device not in _capture_blocks:
            with torch.inference_mode(False):  # plain tensors, whatever mode the first call runs in
                _capture_blocks[device] = torch.zeros(CAPTURE_COUNTERS, dtype=torch.int32, device=device)
            _capture_used[device] = 0
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # zero before a graph captured on any stream replays
        key = _stream_key(device)
        if key not in _linear_counters and tiles <= LINEAR_COUNTERS:
            with torch.inference_mode(False):
                _linear_counters[key] = torch.zeros(LINEAR_COUNTERS, dtype=torch.int32, device=device)
        buffer = _linear_counters.get(key)
        if buffer is not None and tiles <= buffer.numel():
            return buffer
    elif device in _capture_blocks and _capture_used[device] + tiles <= CAPTURE_COUNTERS:
        used = _capture_used[device]
        _capture_used[device] = used + tiles
        return _capture_blocks[device][used:used + tiles]
    return torch.zeros(tiles, dtype=torch.int32, device=device)


def linear_kernels(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   config: Optional[GemmConfig] = None) -> torch.Tensor:
    """out = x @ weightᵀ (+ bias) with the down kernel: x [M, K] and weight [N, K] contiguous, TMA-ready and of
    one dtype, bias [N] or None. The tile's K splits are summed in a fixed order: the same bits every run.
    `config` (fitted, split resolved) overrides `linear_config`: the benchmark and the tests use it. A
    documented-internal entry point: no argument checks, no coverage decision."""
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    c = config or linear_config(m, n, k, sm_count(x.device))
    tiles = cdiv(m, c.block_m) * cdiv(n, c.block_n)
    if c.split_k > 1:
        partial, arrivals = torch.empty(c.split_k * m * n, dtype=torch.float32, device=x.device), split_counters(
            x.device, tiles, captured=x.device.type == "cuda" and torch.cuda.is_current_stream_capturing())
    else:
        partial, arrivals = out, out  # unread without a split
    _down_kernel[(tiles, c.split_k)](
        descriptor(x, [c.block_m, c.block_k]), descriptor(weight, [c.block_n, c.block_k]), bias,
        descriptor(out, [c.block_m, c.block_n]), partial, arrivals, m, n,
        K_BLOCKS_PER_SPLIT=cdiv(cdiv(k, c.block_k), c.split_k), HAS_BIAS=bias is not None, SPLIT_K=c.split_k,
        SWAP_AB=c.swap_ab, PDL=False, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
        RESET_ARRIVALS=True, num_warps=c.num_warps, num_stages=c.num_stages,
    )
    return out


# The kernel objects under documented-internal names (the compile report reads them).
stats_kernel = _stats_kernel
gate_up_kernel = _gate_up_kernel
down_kernel = _down_kernel
