"""The pre-norm GEGLU op's Triton kernels, their launch configs and launchers (see `geglu` for the op).

    y = x + down(gelu(gate(LN(x))) · up(LN(x)))

Three Triton kernels in the forward:
  1. `_ln_stats_kernel`: per-row mean and 1/std of x in fp32 (8 bytes a row; in training also the normalized
     activation, which the backward needs anyway).
  2. `_gate_up_kernel`: one GEMM for gate and up together; each program owns the same columns of gate and up,
     sharing the x tile between both, and its epilogue writes gelu(g) · u. In inference the LayerNorm scale is
     folded into cached weights (`geglu.folded_gate_up`, gate and up rows interleaved): one plain GEMM on x, the
     statistics and the shift applied in the epilogue, which then splits gate from up. In training the
     prologue normalizes each x tile in registers instead (the backward needs the unfolded weights anyway).
     Either way the normalized activation never goes through memory.
     With the fold, nothing but the tensor cores reads the x tile in the loop (the row statistics come from
     pass 1): any register read of it makes Triton 3.6's pipeliner give the tile one shared-memory buffer
     fewer than its async wgmma needs, a race (`tests/test_fused_pre_norm_geglu.py` checks the compiled sm90
     kernel's buffers; results/h200/geglu/README.md, "2026-11-29, branch geglu-speed"). With the fold, its
     grid in the prefill class is persistent: a program walks several tiles, loading the next one's operands
     during this one's epilogue. In inference at the seed class (folded or not) h leaves through a TMA store.
  3. `_down_kernel`: h @ down_weightᵀ with bias and residual in the epilogue. When the output has too few tiles
     to fill the GPU (decode), K is split across programs that each write an fp32 partial; the last program to
     finish a tile (counted with an atomic; pass 1 zeroes the counters, so no memset launch) sums the partials
     in split order, the same bits every run, and applies the epilogue.
On an H200 (SM90) with a supported QuACK installed (`quack_backend.available`), inference on folded weights
outside decode runs passes 2 and 3 as QuACK's CuTe-DSL GEMMs instead (`quack_gemms`: clusters with TMA multicast
and ping-pong warpgroups, which Triton 3.6 cannot build; the same epilogues); where its `computes_row_stats`
holds (the seed class, every CTA resident at once), gate/up computes pass 1's statistics itself and pass 1 does
not run.
The GEMM operands are read through TMA tensor descriptors (Hopper's bulk copy engine feeding wgmma), which
needs 16-byte rows: d_model and d_ff multiples of 8; other widths take the recorded fallback.

Where the gate/up config asks for it (`GemmConfig.dependent_launch`: decode, and training but at prefill), the
gate/up and down kernels use programmatic dependent launch (`PDL`, `pdl_on`): each starts while the one before
it finishes, and waits for it only where it reads that kernel's output. QuACK's GEMMs always launch that way:
down waits before its first load, gate/up in its epilogue, where it reads the statistics.

Backward: one Triton kernel for the GEGLU derivative (and h, recomputed rather than stored), one for the
LayerNorm backward with the residual's gradient added (and partial sums of the LayerNorm weight and bias
grads); dgrad and wgrad are cuBLAS GEMMs (`geglu`).

Internal, for benchmarks and tests (no argument checks, no coverage decisions): `GemmConfig`, the tables
`GATE_UP_CONFIGS`, `PROLOGUE_GATE_UP_CONFIGS`, `TRAINING_GATE_UP_CONFIGS`, `DOWN_CONFIGS`, `shape_class`,
`choose_configs`, `forward_kernels`, `ln_backward_launch`, `LN_BACKWARD_PROGRAMS`, `pdl_on`, `quack_on`,
`quack_gemms_for`, and the kernel objects
`ln_stats_kernel`, `gate_up_kernel`, `down_kernel`, `geglu_backward_kernel`, `ln_backward_kernel` (the
launchers launch whatever these names hold, so a test or the host-path benchmark may replace one).
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from sk import settings
from sk.ops.gated_mlp import quack_backend
from sk.ops.gated_mlp.common import (  # noqa: F401 (the kernels call the _-named helpers by name)
    TMA_ALIGN, TileConfig, _split_k_sum, _tile_coords, _tile_product, align, cdiv, descriptor, next_power_of_2,
    sm_count,
)

_SQRT_HALF = tl.constexpr(0.7071067811865476)  # globals a Triton kernel reads must be constexpr
_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)


# ----------------------------------------------------------------------------------------------- kernels

@triton.jit
def _gelu_and_grad(g, APPROX_TANH: tl.constexpr):
    """gelu(g) and its derivative, in fp32."""
    if APPROX_TANH:
        inner = _SQRT_2_OVER_PI * (g + 0.044715 * g * g * g)
        t = 2.0 * tl.sigmoid(2.0 * inner) - 1.0  # tanh via sigmoid: exact in fp32, and in the interpreter
        act = 0.5 * g * (1.0 + t)
        grad = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * g * g)
    else:
        cdf = 0.5 * (1.0 + tl.math.erf(g * _SQRT_HALF))
        act = g * cdf
        grad = cdf + g * _INV_SQRT_2PI * tl.exp(-0.5 * g * g)
    return act, grad


@triton.jit(do_not_specialize=["n_rows", "eps", "n_arrivals"])
def _ln_stats_kernel(
    x_ptr, stats_ptr, ln_w_ptr, ln_b_ptr, xn_ptr, arrivals_ptr, n_rows, d, eps, n_arrivals,
    D_ALIGN: tl.constexpr, HAS_LN_BIAS: tl.constexpr, STORE_XN: tl.constexpr, ARRIVALS_BLOCK: tl.constexpr,
    PDL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # PDL: launched while the kernel before it finishes (which may be writing x), this waits for it before
    # touching memory, then lets the gate/up kernel launch (programmatic dependent launch; see `pdl_on`).
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    # stats is [2, n_rows] fp32: mean, then 1/std. A whole row sits in registers: two exact passes.
    # ARRIVALS_BLOCK > 0: the split-K down projection's per-tile arrival counters, zeroed here by the first
    # program (they are few: one per output tile at decode), which saves a memset launch before the GEMMs.
    if ARRIVALS_BLOCK > 0:
        if tl.program_id(0) == 0:
            counters = tl.arange(0, ARRIVALS_BLOCK)
            tl.store(arrivals_ptr + counters, tl.zeros((ARRIVALS_BLOCK,), tl.int32), mask=counters < n_arrivals)
    row_stride = d // D_ALIGN * D_ALIGN  # == d, written so the compiler knows its alignment (wide loads)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)[None, :]
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < d)
    offs = rows.to(tl.int64)[:, None] * row_stride + cols
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / d
    centered = tl.where(mask, x - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(centered * centered, axis=1) / d + eps)
    tl.store(stats_ptr + rows, mean, mask=row_ok)
    tl.store(stats_ptr + n_rows + rows, rstd, mask=row_ok)
    if STORE_XN:
        xn = centered * rstd[:, None] * tl.load(ln_w_ptr + cols, mask=cols < d, other=0.0).to(tl.float32)
        if HAS_LN_BIAS:
            xn += tl.load(ln_b_ptr + cols, mask=cols < d, other=0.0).to(tl.float32)
        tl.store(xn_ptr + offs, xn.to(xn_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n_rows"])
def _gate_up_kernel(
    x_desc, stats_ptr, ln_w_ptr, ln_b_ptr, wg_desc, wu_desc, bg_ptr, bu_ptr, fold_ptr, h_ptr, h_desc, gu_ptr,
    n_rows, d, ff,
    FF_ALIGN: tl.constexpr, K_BLOCKS: tl.constexpr, FOLD_LN: tl.constexpr,
    HAS_LN_BIAS: tl.constexpr, HAS_GATE_BIAS: tl.constexpr, HAS_UP_BIAS: tl.constexpr,
    STORE_PREACT: tl.constexpr, APPROX_TANH: tl.constexpr, SWAP_AB: tl.constexpr, PDL: tl.constexpr,
    DOWN_AT_START: tl.constexpr, PERSISTENT: tl.constexpr, TMA_STORE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # PERSISTENT (a grid of a few programs per SM): programs walk the tiles a grid apart, in a loop flattened
    # with the K loop, so that the next tile's operand loads are in flight during this tile's epilogue. The
    # loop's bound is a run-time value, which Triton 3.6's interpreter handles only under NumPy < 2.4
    # (triton-lang/triton#9171; the test extra pins it). Otherwise one program per tile, without the loop:
    # even a loop of one trip changes the register allocation, and spills more (commit bbf160d).
    # PDL: launched while the statistics kernel runs (see `_gate_up_tile`). The down kernel may launch once
    # every program has started (DOWN_AT_START) or has stored its tiles.
    if PDL and DOWN_AT_START:
        gdc_launch_dependents()
    if PDL and not FOLD_LN:
        gdc_wait()
    num_m, num_n = tl.cdiv(n_rows, BLOCK_M), tl.cdiv(ff, BLOCK_N)
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), num_m * num_n, tl.num_programs(0), flatten=True):
            _gate_up_tile(tile, num_m, num_n, x_desc, stats_ptr, ln_w_ptr, ln_b_ptr, wg_desc, wu_desc, bg_ptr,
                          bu_ptr, fold_ptr, h_ptr, h_desc, gu_ptr, n_rows, d, ff, FF_ALIGN, K_BLOCKS, FOLD_LN,
                          HAS_LN_BIAS, HAS_GATE_BIAS, HAS_UP_BIAS, STORE_PREACT, APPROX_TANH, SWAP_AB, PDL,
                          TMA_STORE, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    else:
        _gate_up_tile(tl.program_id(0), num_m, num_n, x_desc, stats_ptr, ln_w_ptr, ln_b_ptr, wg_desc, wu_desc,
                      bg_ptr, bu_ptr, fold_ptr, h_ptr, h_desc, gu_ptr, n_rows, d, ff, FF_ALIGN, K_BLOCKS, FOLD_LN,
                      HAS_LN_BIAS, HAS_GATE_BIAS, HAS_UP_BIAS, STORE_PREACT, APPROX_TANH, SWAP_AB, PDL,
                      TMA_STORE, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    if PDL and not DOWN_AT_START:
        gdc_launch_dependents()


@triton.jit
def _gate_up_tile(
    tile, num_m, num_n, x_desc, stats_ptr, ln_w_ptr, ln_b_ptr, wg_desc, wu_desc, bg_ptr, bu_ptr, fold_ptr, h_ptr,
    h_desc, gu_ptr, n_rows, d, ff,
    FF_ALIGN: tl.constexpr, K_BLOCKS: tl.constexpr, FOLD_LN: tl.constexpr,
    HAS_LN_BIAS: tl.constexpr, HAS_GATE_BIAS: tl.constexpr, HAS_UP_BIAS: tl.constexpr,
    STORE_PREACT: tl.constexpr, APPROX_TANH: tl.constexpr, SWAP_AB: tl.constexpr, PDL: tl.constexpr,
    TMA_STORE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # Operand tiles arrive through TMA descriptors, which zero-fill past the edges: rows past n_rows and
    # columns past d_ff are never stored, and k past d_model meets zero weights, so the loop needs no masks.
    # FOLD_LN: wg_desc holds the gate and up weights with γ folded in and their rows interleaved (gate 0, up 0,
    # gate 1, ...; wu_desc unused), so the loop is one plain GEMM on x with a 2·BLOCK_N-wide weight tile: both
    # operands straight from shared memory into the tensor cores, and one wgmma twice as wide as two separate
    # products (at 64 columns a wgmma reading both operands from shared memory is bound by its bandwidth).
    # The epilogue applies the statistics (see `geglu.folded_gate_up`) and splits the columns into gate and up.
    # Keep every other read of the x tile out of that loop: a register use of a wgmma operand makes Triton 3.6
    # give it one pipeline buffer fewer than the wgmma in flight needs (a race; see the module docstring).
    # Otherwise (training) the prologue normalizes each x tile and two products share it.
    # SWAP_AB (folded only; decode): the product runs transposed, W·xᵀ, so that the weight tile's rows fill
    # wgmma's 64-row side and the few token rows its narrow side (a tile of < 64 rows otherwise runs mma.sync).
    # PDL: this kernel launches only once the statistics kernel has waited for the kernels before the op, so x
    # and the weights are complete; the statistics are read after gdc_wait (with the fold, only in the epilogue:
    # the whole GEMM overlaps that kernel; without, the caller waited).
    # TMA_STORE: h leaves through a descriptor (which clips at the edges) instead of masked stores.
    ff_stride = ff // FF_ALIGN * FF_ALIGN  # == ff, written so the compiler knows its alignment (wide stores)
    pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = offs_m < n_rows
    col_ok = offs_n < ff
    # K loop counts are compile-time (d_model and d_ff are model constants), kept rolled: unrolled, the loop
    # would spill registers.
    if FOLD_LN:
        acc = _tile_product(x_desc, wg_desc, pid_m * BLOCK_M, pid_n * 2 * BLOCK_N, 0, K_BLOCKS, SWAP_AB,
                            BLOCK_M, 2 * BLOCK_N, BLOCK_K)
        if PDL:
            gdc_wait()
        mean = tl.load(stats_ptr + offs_m, mask=row_ok, other=0.0)[:, None]
        rstd = tl.load(stats_ptr + n_rows + offs_m, mask=row_ok, other=0.0)[:, None]
        # x @ (γ⊙W)ᵀ − μ·Σ_k(γ⊙W) = (x − μ) @ (γ⊙W)ᵀ; then · rstd, + (W·β + b). fold is fp32 [2, 2·ff], its
        # columns interleaved as the weights' rows.
        cols2 = pid_n * 2 * BLOCK_N + tl.arange(0, 2 * BLOCK_N)
        cols2_ok = cols2 < 2 * ff
        acc = rstd * (acc - mean * tl.load(fold_ptr + cols2, mask=cols2_ok, other=0.0)[None, :])
        acc += tl.load(fold_ptr + 2 * ff + cols2, mask=cols2_ok, other=0.0)[None, :]
        acc_g, acc_u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
    else:
        mean = tl.load(stats_ptr + offs_m, mask=row_ok, other=0.0)[:, None]
        rstd = tl.load(stats_ptr + n_rows + offs_m, mask=row_ok, other=0.0)[:, None]
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(K_BLOCKS, loop_unroll_factor=1):
            x = x_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
            wg = wg_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
            wu = wu_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
            k_offs = k * BLOCK_K + tl.arange(0, BLOCK_K)
            k_ok = k_offs < d  # the zero-filled k past d_model: zero scale and shift
            ln_w = tl.load(ln_w_ptr + k_offs, mask=k_ok, other=0.0)
            xn = (x.to(tl.float32) - mean) * rstd * ln_w.to(tl.float32)[None, :]
            if HAS_LN_BIAS:
                xn += tl.load(ln_b_ptr + k_offs, mask=k_ok, other=0.0).to(tl.float32)[None, :]
            a = xn.to(wg.dtype)  # rounded once to the compute dtype, as eager's LayerNorm output is
            acc_g = tl.dot(a, wg.T, acc_g)
            acc_u = tl.dot(a, wu.T, acc_u)
        if HAS_GATE_BIAS:
            acc_g += tl.load(bg_ptr + offs_n, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_UP_BIAS:
            acc_u += tl.load(bu_ptr + offs_n, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    act, _ = _gelu_and_grad(acc_g, APPROX_TANH)
    out_rows = offs_m.to(tl.int64)[:, None]
    out_cols = offs_n[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    if TMA_STORE:
        h_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], (act * acc_u).to(h_desc.dtype))
    else:
        tl.store(h_ptr + out_rows * ff_stride + out_cols, (act * acc_u).to(h_ptr.dtype.element_ty), mask=mask)
    if STORE_PREACT:  # gate and up pre-activations, [g | u] per row, for the backward
        gu_ptrs = gu_ptr + out_rows * (2 * ff_stride) + out_cols
        tl.store(gu_ptrs, acc_g.to(gu_ptr.dtype.element_ty), mask=mask)
        tl.store(gu_ptrs + ff_stride, acc_u.to(gu_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n_rows"])
def _down_kernel(
    h_desc, wd_desc, bd_ptr, x_desc, y_desc, partial_ptr, arrivals_ptr,
    n_rows, d,
    K_BLOCKS_PER_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, SWAP_AB: tl.constexpr,
    PDL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # TMA zero-fills past every edge, K included (a split whose blocks run past d_ff adds zeros), and clips
    # the stores: no masks, and no per-element addresses held in registers through the epilogue.
    # PDL: launched while the gate/up kernel finishes; everything it reads or writes waits for that kernel
    # (which itself waited for the statistics kernel, which zeroed the arrival counters).
    if PDL:
        gdc_wait()
    tile = tl.program_id(0)
    pid_m, pid_n = _tile_coords(tile, tl.cdiv(n_rows, BLOCK_M), tl.cdiv(d, BLOCK_N), GROUP_M)
    # SWAP_AB: as in the gate/up kernel, W·hᵀ for few rows (wgmma's 64-row side taken by the weight tile).
    k_first = tl.program_id(1) * K_BLOCKS_PER_SPLIT
    acc = _tile_product(h_desc, wd_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, k_first, K_BLOCKS_PER_SPLIT, SWAP_AB,
                        BLOCK_M, BLOCK_N, BLOCK_K)
    if SPLIT_K > 1:
        acc, last = _split_k_sum(acc, partial_ptr, arrivals_ptr, tile, pid_m, pid_n, n_rows, d, SPLIT_K, BLOCK_M,
                                 BLOCK_N)
        if last:
            _down_epilogue(acc, bd_ptr, x_desc, y_desc, pid_m, pid_n, d, HAS_BIAS, BLOCK_M, BLOCK_N)
    else:
        _down_epilogue(acc, bd_ptr, x_desc, y_desc, pid_m, pid_n, d, HAS_BIAS, BLOCK_M, BLOCK_N)


@triton.jit
def _down_epilogue(acc, bd_ptr, x_desc, y_desc, pid_m, pid_n, d, HAS_BIAS: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    if HAS_BIAS:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc += tl.load(bd_ptr + offs_n, mask=offs_n < d, other=0.0).to(tl.float32)[None, :]
    acc += x_desc.load([pid_m * BLOCK_M, pid_n * BLOCK_N]).to(tl.float32)
    y_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(y_desc.dtype))


@triton.jit(do_not_specialize=["n_rows"])
def _geglu_backward_kernel(
    dh_ptr, gu_ptr, dgu_ptr, h_ptr, n_rows, ff, FF_ALIGN: tl.constexpr, APPROX_TANH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # dg = dh · u · gelu'(g), du = dh · gelu(g), and h = gelu(g) · u recomputed for the down wgrad.
    ff_stride = ff // FF_ALIGN * FF_ALIGN
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < ff
    dh = tl.load(dh_ptr + row * ff_stride + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gu_ptr + row * 2 * ff_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * ff_stride + ff_stride + cols, mask=mask, other=0.0).to(tl.float32)
    act, grad = _gelu_and_grad(g, APPROX_TANH)
    dtype = dgu_ptr.dtype.element_ty
    tl.store(dgu_ptr + row * 2 * ff_stride + cols, (dh * u * grad).to(dtype), mask=mask)
    tl.store(dgu_ptr + row * 2 * ff_stride + ff_stride + cols, (dh * act).to(dtype), mask=mask)
    tl.store(h_ptr + row * ff_stride + cols, (act * u).to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n_rows"])
def _ln_backward_kernel(
    dxn_ptr, x_ptr, dy_ptr, stats_ptr, ln_w_ptr, dx_ptr, partial_ptr, n_rows, d,
    D_ALIGN: tl.constexpr, ITERS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # dx = rstd·(dx̂ − x̂·mean(dx̂·x̂) − mean(dx̂)) + dy, dx̂ = γ·dxn: LayerNorm's backward with the residual's
    # gradient added, in fp32 and rounded once. Each program also sums dxn·x̂, dxn and dy over its
    # ITERS·BLOCK_M rows into partial[0|1|2, program, :] (the LayerNorm weight and bias grads and the down
    # projection's bias grad, summed over programs after).
    row_stride = d // D_ALIGN * D_ALIGN
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < d
    w = tl.load(ln_w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    dw = tl.zeros((BLOCK_D,), dtype=tl.float32)
    db = tl.zeros((BLOCK_D,), dtype=tl.float32)
    d_down_b = tl.zeros((BLOCK_D,), dtype=tl.float32)
    first = tl.program_id(0) * (ITERS * BLOCK_M)
    for i in tl.range(ITERS, loop_unroll_factor=1):
        rows = first + i * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & col_ok[None, :]
        offs = rows.to(tl.int64)[:, None] * row_stride + cols[None, :]
        mean = tl.load(stats_ptr + rows, mask=row_ok, other=0.0)[:, None]
        rstd = tl.load(stats_ptr + n_rows + rows, mask=row_ok, other=0.0)[:, None]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(dxn_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        dxhat = g * w
        c1 = (tl.sum(dxhat * xhat, axis=1) / d)[:, None]
        c2 = (tl.sum(dxhat, axis=1) / d)[:, None]
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + offs, (rstd * (dxhat - xhat * c1 - c2) + dy).to(dx_ptr.dtype.element_ty), mask=mask)
        dw += tl.sum(g * xhat, axis=0)
        db += tl.sum(g, axis=0)
        d_down_b += tl.sum(dy, axis=0)
    programs = tl.num_programs(0)
    tl.store(partial_ptr + tl.program_id(0) * d + cols, dw, mask=col_ok)
    tl.store(partial_ptr + (programs + tl.program_id(0)) * d + cols, db, mask=col_ok)
    tl.store(partial_ptr + (2 * programs + tl.program_id(0)) * d + cols, d_down_b, mask=col_ok)


# The kernel objects under their documented-internal names; the launchers below launch what these hold.
ln_stats_kernel = _ln_stats_kernel
gate_up_kernel = _gate_up_kernel
down_kernel = _down_kernel
geglu_backward_kernel = _geglu_backward_kernel
ln_backward_kernel = _ln_backward_kernel


# ----------------------------------------------------------------------------------------------- launch configs

@dataclasses.dataclass(frozen=True)
class GemmConfig(TileConfig):
    """`TileConfig` (tile shape, pipelining, split_k > 1 only for the down projection, swap_ab for gate/up in
    inference only, dependent_launch, source) plus the GEGLU gate/up kernel's own knobs:
    programs_per_sm > 0 launches at most that many programs per SM, each walking several tiles (a persistent
    grid; 0: one program per tile); tma_store: h leaves through a TMA descriptor; group_rows_bytes > 0 sets
    group_m instead (see `fitted`): as many row tiles as hold that many bytes of the first operand (block_m · K
    elements of 2 bytes: bf16/fp16, the GEMMs' dtypes on the GPU), so that a group's rows stay in L2 while the
    second operand streams past them once per group."""
    programs_per_sm: int = 0
    tma_store: bool = False
    group_rows_bytes: int = 0

    def fitted(self, m: int, n: int, k: int) -> "GemmConfig":
        """`TileConfig.fitted`, and group_m from group_rows_bytes where that is set."""
        fitted = super().fitted(m, n, k)
        if not self.group_rows_bytes:
            return fitted
        return dataclasses.replace(fitted, group_m=max(1, self.group_rows_bytes // (2 * fitted.block_m * k)))


# Chosen per shape class on the H200 (benchmarks/bench_geglu.py --sweep) and fixed: no autotuning at call
# time, so every call (and CUDA-graph capture) launches an already-chosen kernel. Each entry's `source` names the
# committed results it was chosen from (the runs: results/h200/geglu/README.md):
# - decode: products transposed (swap_ab) and the down projection's K split, so that its few output tiles still
#   spread over the GPU; the down kernel launched at gate/up's start.
# - small (seed): 64-row tiles, so that the seed shape's programs (368 gate/up, 96 down) are all resident at
#   once. Gate/up one program per 64 × 64 tile, h stored by TMA, in plain stream order ("at_start" lets the down
#   programs take SM slots that gate/up's own programs wait for).
# - large (prefill): gate/up on a persistent grid, one program per SM, 4 stages; plain stream order, the launch
#   modes being within the run-to-run spread there.
# - down tiles, every class: one sweep; its group stays 8 (the others within the spread).
# "large" gate/up groups 16 MB of x rows (32 row tiles at d_model 2048, 16 at 4096), which stay in L2 while the
# weights stream past once per group; larger groups are evicted by them (`_GROUP`).
_RUNS = "results/h200/geglu/2026-11-30"
_GROUP = f"{_RUNS}/eighth-run/experiments/group.json"
GATE_UP_L2_GROUP_BYTES = 16 << 20
GATE_UP_CONFIGS = {
    "decode": GemmConfig(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=4, swap_ab=True,
                         dependent_launch="at_start",
                         source=f"{_RUNS}/second-run/decode-swap/bench_geglu_sweep.json (swap_ab); "
                                f"{_RUNS}/sixth-run/tables-run/bench_geglu_sweep.json (at_start)"),
    "small": GemmConfig(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=3, tma_store=True,
                        source=f"{_RUNS}/seventh-run/experiments/down_gate_up.json; "
                               f"{_RUNS}/seventh-run/first-run/sweep/bench_geglu.json"),
    "large": GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4, programs_per_sm=1,
                        group_rows_bytes=GATE_UP_L2_GROUP_BYTES,
                        source=f"{_RUNS}/sixth-run/persistent/; {_RUNS}/fourth-run/prefill/bench_geglu_sweep.json "
                               f"(stream order); {_GROUP} (group)"),
}
# The gate/up kernel normalizing x in its prologue (inference without the fold: SK_GEGLU_FOLD_LN=0, weights
# made under torch.inference_mode, traced calls), one program per tile: on a persistent grid it spills at
# prefill (commit bbf160d). "small" as the folded table's, h stored by TMA (128 × 128 tiles would leave a
# handful of programs at the class's smaller M). "large" with 4 stages, as training's, its x rows grouped as the
# folded kernel's.
PROLOGUE_GATE_UP_CONFIGS = {
    **GATE_UP_CONFIGS,
    "small": dataclasses.replace(GATE_UP_CONFIGS["small"],
                                 source=f"{_RUNS}/seventh-run/unfolded/bench_geglu_sweep.json"),
    "large": GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4,
                        group_rows_bytes=GATE_UP_L2_GROUP_BYTES,
                        source=f"{_RUNS}/sixth-run/review-run/bench_geglu.md; {_GROUP} (group)"),
}
# Training's (the prologue kernel storing the pre-activations too) needs more registers: at the seed shape a
# 64 × 64 tile with 4 warps spills 264 bytes on sm90, with 8 warps none (benchmarks/compile_report_geglu.py;
# not yet timed). At "large", 128 × 128 spills 240 bytes either way; 128 × 64 does not (to be swept).
TRAINING_GATE_UP_CONFIGS = {
    **PROLOGUE_GATE_UP_CONFIGS,
    "small": GemmConfig(block_m=64, block_n=128, block_k=64, num_warps=8, num_stages=3,
                        dependent_launch="after_stores",
                        source="untuned (no spills in benchmarks/compile_report_geglu.py; not yet timed)"),
}
_DOWN = f"{_RUNS}/sixth-run/sweep-down-run/bench_geglu_sweep.json; {_RUNS}/eighth-run/experiments/down.json (group)"
DOWN_CONFIGS = {
    "decode": GemmConfig(block_m=32, block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=8, swap_ab=True,
                         source=f"{_DOWN}; {_RUNS}/second-run/decode-swap/bench_geglu_sweep.json (split, swap_ab)"),
    "small": GemmConfig(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=3, source=_DOWN),
    "large": GemmConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, source=_DOWN),
}


def shape_class(m: int, d: int, ff: int) -> str:
    if m <= 64:
        return "decode"
    return "small" if m * d * ff < 2**33 else "large"


@functools.lru_cache(maxsize=256)
def choose_configs(m: int, d: int, ff: int, gate_up_kernel: str = "folded") -> tuple[GemmConfig, GemmConfig]:
    """(gate_up, down) configs for this shape: its class's, with blocks no larger than the problem and K split
    no finer than 4 blocks per split. `gate_up_kernel`: "folded" (inference on folded weights), "prologue"
    (inference normalizing x in the prologue) or "training" (that, storing the pre-activations too)."""
    cls = shape_class(m, d, ff)
    down = DOWN_CONFIGS[cls].fitted(m, d, ff)
    split = max(1, min(down.split_k, cdiv(ff, down.block_k) // 4))
    gate_up = {"folded": GATE_UP_CONFIGS, "prologue": PROLOGUE_GATE_UP_CONFIGS,
               "training": TRAINING_GATE_UP_CONFIGS}[gate_up_kernel][cls]
    return gate_up.fitted(m, ff, d), dataclasses.replace(down, split_k=split)


# The SMs a persistent grid fills in the interpreter (CPU tensors): 2, so that its programs walk tiles.
INTERPRETED_SMS = 2


# ----------------------------------------------------------------------------------------------- launchers

# Programmatic dependent launch (Hopper), where the gate/up config's `dependent_launch` asks for it: the gate/up
# and down kernels are launched while the kernel before them still runs, so that their launch and set-up (and,
# with the fold, gate/up's whole GEMM) overlap it; each waits (gdc_wait) before touching what that kernel
# writes. The statistics kernel launches dependently on whatever kernel runs before the op, but waits for it
# to finish before touching memory and only then lets gate/up launch, so nothing of the op's memory traffic
# overlaps the caller's kernels: what it gains is its own launch, hidden behind the end of the kernel before
# (where that kernel lets dependents launch early, as QuACK's down GEMM does after its tile loop). Gate/up then
# reads x through L2, where the finished kernel's writes are (the PTX model promises them only to the grid that
# waited). Not in the interpreter (no inline PTX); SK_GEGLU_PDL=0 (`sk.settings`, "geglu_pdl") turns it off.
def pdl_on() -> bool:
    return settings.get("geglu_pdl") and not settings.get("triton_interpret")


# QuACK's CuTe-DSL GEMMs (`quack_gemms`, admitted by `quack_backend.available`) run inference on folded weights in
# the shape classes they have configs for; SK_GEGLU_CUTE=0 ("geglu_cute") keeps the Triton GEMMs there too.
def quack_on() -> bool:
    return settings.get("geglu_cute") and not settings.get("triton_interpret")


def quack_gemms_for(device: torch.device, m: int, d: int, ff: int, folded: bool):
    """The QuACK GEMM backend if it takes this forward's GEMMs (inference on folded weights, in a shape class
    it has configs for, where `quack_backend.available`, `quack_on()`), else None."""
    if not (folded and quack_on()):
        return None
    gemms = quack_backend.available(device)
    return gemms if gemms is not None and shape_class(m, d, ff) in gemms.GATE_UP_CONFIGS else None


def forward_kernels(x2, ln_w, ln_b, wg, bg, wu, bu, wd, bd, eps, approximate, save_for_backward,
                    configs: tuple[GemmConfig, GemmConfig] | None = None, fold: torch.Tensor | None = None):
    """Run the three forward kernels. Returns (y, stats, xn, gu); xn and gu are empty unless saving.
    With `fold` (from `geglu.folded_gate_up` / `geglu.fold_gate_up`; inference only, not with
    save_for_backward), wg is the folded gate/up weight that comes with it (rows interleaved) and wu is None;
    then, without explicit `configs`, QuACK's GEMMs take the gate/up and down products where they run
    (`quack_gemms_for`).
    A documented-internal entry point: no argument checks, no coverage decision."""
    m, d = x2.shape
    ff = wd.shape[1]
    dtype, dev = x2.dtype, x2.device
    y = torch.empty((m, d), dtype=dtype, device=dev)
    stats = torch.empty((2, m), dtype=torch.float32, device=dev)
    xn = torch.empty((m, d) if save_for_backward else 0, dtype=dtype, device=dev)
    gu = torch.empty((m, 2 * ff) if save_for_backward else 0, dtype=dtype, device=dev)
    if m == 0:
        return y, stats, xn, gu
    gate_up, down = configs or choose_configs(
        m, d, ff, "training" if save_for_backward else "prologue" if fold is None else "folded")
    cute_gemms = quack_gemms_for(dev, m, d, ff, fold is not None and configs is None)
    size_class = shape_class(m, d, ff)
    h = torch.empty((m, ff), dtype=dtype, device=dev)
    counters = (cute_gemms.row_stats_counters(dev) if cute_gemms is not None
                and cute_gemms.computes_row_stats(m, d, ff, size_class, dev) else None)
    if counters is not None:
        # Gate/up computes the statistics itself, in warps that would otherwise idle, so it is the op's first
        # kernel: one link fewer in the chain of dependent launches
        # (results/h200/geglu/2026-12-01/thirteenth-run/experiments/third/).
        cute_gemms.gate_up(x2, stats, wg, fold, h, approximate, size_class, row_stats=(counters, eps))
        cute_gemms.down(h, wd, bd, x2, y, size_class)
        return y, stats, xn, gu
    pdl_enabled = pdl_on()
    pdl = pdl_enabled and cute_gemms is None and gate_up.dependent_launch != "none"
    # QuACK's GEMMs launch dependently and wait for the kernel before them (gate/up in its epilogue, see
    # `quack_gemms`), so the statistics kernel may let gate/up launch at its start there too: its
    # launch, set-up and main loop overlap the statistics
    # (results/h200/geglu/2026-12-01/tenth-run/experiments/stats_pdl.json). The statistics kernel's own dependent
    # launch (see `pdl_on`): results/h200/geglu/2026-12-01/twelfth-run/experiments/stats_dependent_launch.json.
    stats_pdl = pdl_enabled and (cute_gemms is not None or pdl)
    d_align, ff_align = align(d), align(ff)
    approx_tanh = approximate == "tanh"
    tiles = cdiv(m, down.block_m) * cdiv(d, down.block_n)
    if down.split_k > 1:
        # One fp32 partial per split, then one arrival counter per tile (zeroed by the stats kernel).
        scratch = torch.empty(down.split_k * m * d + tiles, dtype=torch.float32, device=dev)
        partial, arrivals = scratch[: down.split_k * m * d], scratch[down.split_k * m * d:].view(torch.int32)
    else:
        partial, arrivals = y, stats  # unread without a split

    block_d = next_power_of_2(d)
    rows_per_program = max(1, min(16, 2048 // block_d))
    ln_stats_kernel[(cdiv(m, rows_per_program),)](
        x2, stats, ln_w, ln_b, xn, arrivals, m, d, eps, tiles,
        D_ALIGN=d_align, HAS_LN_BIAS=ln_b is not None, STORE_XN=save_for_backward,
        ARRIVALS_BLOCK=max(16, next_power_of_2(tiles)) if down.split_k > 1 else 0, PDL=stats_pdl,
        BLOCK_M=rows_per_program, BLOCK_D=block_d,
        num_warps=min(16, max(1, rows_per_program * block_d // 512)), launch_pdl=stats_pdl,
    )

    if cute_gemms is not None:
        cute_gemms.gate_up(x2, stats, wg, fold, h, approximate, size_class)
        cute_gemms.down(h, wd, bd, x2, y, size_class)
        return y, stats, xn, gu
    c = gate_up
    tma = descriptor  # zero-filled past the edges; blocks as the kernel's tiles
    programs = cdiv(m, c.block_m) * cdiv(ff, c.block_n)  # one per tile, or (persistent) a few per SM
    if c.programs_per_sm:
        programs = min(programs, c.programs_per_sm * sm_count(dev, INTERPRETED_SMS))
    gate_up_kernel[(programs,)](
        tma(x2, [c.block_m, c.block_k]), stats, ln_w, ln_b,
        *((tma(wg, [2 * c.block_n, c.block_k]),) * 2 if fold is not None else
          (tma(wg, [c.block_n, c.block_k]), tma(wu, [c.block_n, c.block_k]))), bg, bu,
        fold if fold is not None else stats, h,  # stats: unread without FOLD_LN
        tma(h, [c.block_m, c.block_n]) if c.tma_store else h, gu, m, d, ff,
        FF_ALIGN=ff_align, K_BLOCKS=cdiv(d, c.block_k), FOLD_LN=fold is not None,
        HAS_LN_BIAS=ln_b is not None, HAS_GATE_BIAS=bg is not None, HAS_UP_BIAS=bu is not None,
        STORE_PREACT=save_for_backward, APPROX_TANH=approx_tanh, SWAP_AB=c.swap_ab and fold is not None, PDL=pdl,
        DOWN_AT_START=c.dependent_launch == "at_start", PERSISTENT=c.programs_per_sm > 0, TMA_STORE=c.tma_store,
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
        num_warps=c.num_warps, num_stages=c.num_stages, launch_pdl=pdl,
    )

    c = down
    down_kernel[(tiles, c.split_k)](
        tma(h, [c.block_m, c.block_k]), tma(wd, [c.block_n, c.block_k]), bd,
        tma(x2, [c.block_m, c.block_n]), tma(y, [c.block_m, c.block_n]), partial, arrivals, m, d,
        K_BLOCKS_PER_SPLIT=cdiv(cdiv(ff, c.block_k), c.split_k), HAS_BIAS=bd is not None, SPLIT_K=c.split_k,
        SWAP_AB=c.swap_ab, PDL=pdl,
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
        num_warps=c.num_warps, num_stages=c.num_stages, launch_pdl=pdl,
    )
    return y, stats, xn, gu


LN_BACKWARD_PROGRAMS = 256  # about two per SM: fewer partial rows to sum, enough programs to fill the GPU


def ln_backward_launch(m: int, d: int) -> tuple[int, dict]:
    """Programs and compile-time parameters of `_ln_backward_kernel` for m rows of d_model d."""
    block_d = next_power_of_2(d)
    rows_per_block = max(1, min(16, 2048 // block_d))
    iters = next_power_of_2(cdiv(cdiv(m, rows_per_block), LN_BACKWARD_PROGRAMS))
    # 8 elements a thread per row tile: six such tiles live at once, without spills on sm90 up to d_model 2048
    # (16 and 32 bytes at 4096 and 8192, where registers per thread run out; benchmarks/compile_report_geglu.py).
    return cdiv(m, rows_per_block * iters), dict(
        D_ALIGN=align(d), ITERS=iters, BLOCK_M=rows_per_block, BLOCK_D=block_d,
        num_warps=min(32, max(1, rows_per_block * block_d // 256)))
