"""The pre-norm GEGLU feed-forward block as one op: y = x + down(gelu(gate(LN(x))) · up(LN(x))).

Three Triton kernels in the forward:
  1. `_ln_stats_kernel`: per-row mean and 1/std of x in fp32 (8 bytes a row; in training also the normalized
     activation, which the backward needs anyway).
  2. `_gate_up_kernel`: one GEMM for gate and up together; each program owns the same columns of gate and up,
     sharing the x tile between both, and its epilogue writes gelu(g) · u. In inference the LayerNorm scale is
     folded into cached weights (`_folded_gate_up`, gate and up rows interleaved): one plain GEMM on x, the
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
On an H200 (SM90) with QuACK installed, inference on folded weights outside decode runs passes 2 and 3 as
QuACK's CuTe-DSL GEMMs instead (`fused_pre_norm_geglu_cute`: clusters with TMA multicast and ping-pong
warpgroups, which Triton 3.6 cannot build; the same epilogues); where its `computes_row_stats` holds (the
seed class, every CTA resident at once), gate/up computes pass 1's statistics itself and pass 1 does not run.
The GEMM operands are read through TMA tensor descriptors (Hopper's bulk copy engine feeding wgmma), which
needs 16-byte rows: d_model and d_ff multiples of 8; other widths take the recorded fallback.
Matrix products take operands in the activation dtype (bf16/fp16) and accumulate in fp32; LayerNorm reads
its scale and shift in their own precision (the FP32 masters). Training rounds the normalized activation
once to the activation dtype, as eager's LayerNorm output is; inference rounds γ⊙W once instead. Higher-
precision projection weights are cast to the activation dtype once and cached until they change
(`compute_weight`, `_folded_gate_up`, through `sk.ops.weight_cache`: never re-made inside a CUDA graph of
inference, see there).

Where the gate/up config asks for it (`GemmConfig.dependent_launch`: decode, and training but at prefill), the
gate/up and down kernels use programmatic dependent launch (`PDL`): each starts while the one before it
finishes, and waits for it only where it reads that kernel's output. QuACK's GEMMs (`fused_pre_norm_geglu_cute`)
always launch that way: down waits before its first load, gate/up in its epilogue, where it reads the statistics.

Backward: one Triton kernel for the GEGLU derivative (and h, recomputed rather than stored), one for the
LayerNorm backward with the residual's gradient added (and partial sums of the LayerNorm weight and bias
grads); dgrad and wgrad are cuBLAS GEMMs.

Eager calls run the kernels through an autograd.Function (`_EagerFunction`); torch.compile and other
tracing go through the `torch.library` custom ops (with fake implementations), which run the same code.
Eager training steps that repeat (same shapes, same parameters) are replayed from CUDA graphs of the forward
and the backward once seen twice (`sk_core/ops/_step_graphs.py`; `SK_STEP_GRAPHS=0` turns it off): at the seed
shape the step is otherwise bound by the host's launch work.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import warnings
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.tools.tensor_descriptor import TensorDescriptor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from sk import coverage, settings
from sk.ops._common import FLOAT_DTYPES, check_float, check_same_device
from sk.ops import weight_cache
from sk.ops.act_and_mul import launch as _act_launch
from sk.ops._step_graphs import StepGraphs

OP = "fused_pre_norm_geglu"
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


@triton.jit
def _tile_coords(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """Grouped ordering: GROUP_M row tiles walk the columns together, so their operands stay in L2."""
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    return first_m + (pid % width) % size_m, (pid % width) // size_m


@triton.jit(do_not_specialize=["n_rows", "eps", "n_arrivals"])
def _ln_stats_kernel(
    x_ptr, stats_ptr, ln_w_ptr, ln_b_ptr, xn_ptr, arrivals_ptr, n_rows, d, eps, n_arrivals,
    D_ALIGN: tl.constexpr, HAS_LN_BIAS: tl.constexpr, STORE_XN: tl.constexpr, ARRIVALS_BLOCK: tl.constexpr,
    PDL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # PDL: launched while the kernel before it finishes (which may be writing x), this waits for it before
    # touching memory, then lets the gate/up kernel launch (programmatic dependent launch; see `_pdl_on`).
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


@triton.jit
def _tile_product(a_desc, b_desc, a_row, b_row, k_first, K_STEPS: tl.constexpr, SWAP_AB: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """A·Bᵀ in fp32 for the BLOCK_M rows of A from a_row and the BLOCK_N rows of B from b_row, over K_STEPS
    blocks of K from block k_first. SWAP_AB: computed as (B·Aᵀ)ᵀ, so that B's rows take wgmma's 64-row side
    when A has fewer rows (a tile of < 64 rows otherwise runs mma.sync)."""
    acc = tl.zeros((BLOCK_N, BLOCK_M) if SWAP_AB else (BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(K_STEPS, loop_unroll_factor=1):
        a = a_desc.load([a_row, (k_first + k) * BLOCK_K])
        b = b_desc.load([b_row, (k_first + k) * BLOCK_K])
        if SWAP_AB:
            acc = tl.dot(b, a.T, acc)
        else:
            acc = tl.dot(a, b.T, acc)
    if SWAP_AB:
        acc = acc.T
    return acc


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
    # The epilogue applies the statistics (see `_folded_gate_up`) and splits the columns into gate and up.
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
        # partial is [SPLIT_K, n_rows, d] fp32. As in CUTLASS's serial
        # split-K: plain stores, a barrier, then one release (the counter); the last program acquires it.
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (offs_m < n_rows)[:, None] & (offs_n < d)[None, :]
        partial_ptrs = partial_ptr + offs_m.to(tl.int64)[:, None] * d + offs_n[None, :]
        split_stride = n_rows.to(tl.int64) * d
        tl.store(partial_ptrs + tl.program_id(1) * split_stride, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial is in before the tile's arrival is counted
        arrived = tl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:  # the last split of this tile: all partials are in
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for split in tl.static_range(SPLIT_K):  # in split order: the same sum, bit for bit, every run
                acc += tl.load(partial_ptrs + split * split_stride, mask=mask, other=0.0, cache_modifier=".cg")
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


# ----------------------------------------------------------------------------------------------- launch configs

@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """Tile shape and pipelining of one GEMM kernel; split_k > 1 only for the down projection."""
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    split_k: int = 1
    swap_ab: bool = False  # W·xᵀ rather than x·Wᵀ, for tiles of fewer than 64 rows (gate/up: inference only)
    # Gate/up only (see `_pdl_on`): "none" (plain stream order), "after_stores" (the down kernel launches as the
    # gate/up programs finish) or "at_start" (once every gate/up program has started; its programs then wait).
    dependent_launch: str = "none"
    # Gate/up only: programs_per_sm > 0 launches at most that many programs per SM, each walking several tiles
    # (a persistent grid; 0: one program per tile); tma_store: h leaves through a TMA descriptor.
    programs_per_sm: int = 0
    tma_store: bool = False
    # group_rows_bytes > 0 sets group_m instead (see `fitted`): as many row tiles as hold that many bytes of the
    # first operand (block_m · K elements of 2 bytes: bf16/fp16, the GEMMs' dtypes on the GPU), so that a
    # group's rows stay in L2 while the second operand streams past them once per group.
    group_rows_bytes: int = 0

    def fitted(self, m: int, n: int, k: int) -> "GemmConfig":
        """The same config with blocks no larger than the problem (16 is tl.dot's smallest side), swapped only
        where the rows fall below wgmma's 64, and group_m from group_rows_bytes where that is set."""
        def fit(block, size):
            return min(block, max(16, _next_power_of_2(size)))
        block_m = fit(self.block_m, m)
        group_m = max(1, self.group_rows_bytes // (2 * block_m * k)) if self.group_rows_bytes else self.group_m
        return dataclasses.replace(self, block_m=block_m, block_n=fit(self.block_n, n), block_k=fit(self.block_k, k),
                                   swap_ab=self.swap_ab and block_m < 64, group_m=group_m)


# Chosen per shape class on the H200 (benchmarks/bench_geglu.py --sweep) and fixed: no autotuning at call
# time, so every call (and CUDA-graph capture) launches an already-chosen kernel. Each entry's committed result
# (the runs: results/h200/geglu/README.md):
# - decode: products transposed (swap_ab) and the down projection's K split, so that its few output tiles still
#   spread over the GPU: results/h200/geglu/2026-11-30/second-run/decode-swap/bench_geglu_sweep.json; the down
#   kernel launched at gate/up's start: results/h200/geglu/2026-11-30/sixth-run/tables-run/bench_geglu_sweep.json.
# - small (seed): 64-row tiles, so that the seed shape's programs (368 gate/up, 96 down) are all resident at
#   once. Gate/up one program per 64 × 64 tile, h stored by TMA, in plain stream order ("at_start" lets the down
#   programs take SM slots that gate/up's own programs wait for):
#   results/h200/geglu/2026-11-30/seventh-run/experiments/down_gate_up.json,
#   results/h200/geglu/2026-11-30/seventh-run/first-run/sweep/bench_geglu.json.
# - large (prefill): gate/up on a persistent grid, one program per SM, 4 stages:
#   results/h200/geglu/2026-11-30/sixth-run/persistent/; plain stream order, the launch modes being within the
#   run-to-run spread there: results/h200/geglu/2026-11-30/fourth-run/prefill/bench_geglu_sweep.json.
# - down tiles, every class: results/h200/geglu/2026-11-30/sixth-run/sweep-down-run/bench_geglu_sweep.json; its
#   group stays 8 (the others within the spread): results/h200/geglu/2026-11-30/eighth-run/experiments/down.json.
# "large" gate/up groups 16 MB of x rows (32 row tiles at d_model 2048, 16 at 4096), which stay in L2 while the
# weights stream past once per group; larger groups are evicted by them:
# results/h200/geglu/2026-11-30/eighth-run/experiments/group.json.
GATE_UP_L2_GROUP_BYTES = 16 << 20
GATE_UP_CONFIGS = {
    "decode": GemmConfig(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=4, swap_ab=True,
                         dependent_launch="at_start"),
    "small": GemmConfig(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=3, tma_store=True),
    "large": GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4, programs_per_sm=1,
                        group_rows_bytes=GATE_UP_L2_GROUP_BYTES),
}
# The gate/up kernel normalizing x in its prologue (inference without the fold: SK_GEGLU_FOLD_LN=0, weights
# made under torch.inference_mode, traced calls), one program per tile: on a persistent grid it spills at
# prefill (commit bbf160d). "small" as the folded table's, h stored by TMA
# (results/h200/geglu/2026-11-30/seventh-run/unfolded/bench_geglu_sweep.json; 128 × 128 tiles would leave a
# handful of programs at the class's smaller M). "large" with 4 stages, as training's
# (results/h200/geglu/2026-11-30/sixth-run/review-run/bench_geglu.md), its x rows grouped as the folded kernel's
# (results/h200/geglu/2026-11-30/eighth-run/experiments/group.json).
PROLOGUE_GATE_UP_CONFIGS = {
    **GATE_UP_CONFIGS,
    "large": GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4,
                        group_rows_bytes=GATE_UP_L2_GROUP_BYTES),
}
# Training's (the prologue kernel storing the pre-activations too) needs more registers: at the seed shape a
# 64 × 64 tile with 4 warps spills 264 bytes on sm90, with 8 warps none (benchmarks/compile_report_geglu.py;
# not yet timed). At "large", 128 × 128 spills 240 bytes either way; 128 × 64 does not (to be swept).
TRAINING_GATE_UP_CONFIGS = {
    **PROLOGUE_GATE_UP_CONFIGS,
    "small": GemmConfig(block_m=64, block_n=128, block_k=64, num_warps=8, num_stages=3,
                        dependent_launch="after_stores"),
}
DOWN_CONFIGS = {
    "decode": GemmConfig(block_m=32, block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=8, swap_ab=True),
    "small": GemmConfig(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=3),
    "large": GemmConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3),
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
    split = max(1, min(down.split_k, _cdiv(ff, down.block_k) // 4))
    gate_up = {"folded": GATE_UP_CONFIGS, "prologue": PROLOGUE_GATE_UP_CONFIGS,
               "training": TRAINING_GATE_UP_CONFIGS}[gate_up_kernel][cls]
    return gate_up.fitted(m, ff, d), dataclasses.replace(down, split_k=split)


TMA_ALIGN = 8  # elements: the GEMM operands' rows must start on 16-byte boundaries for TMA


# Host-side integer helpers in plain Python: triton.cdiv / next_power_of_2 cost microseconds a call, and
# a forward makes a dozen such calls.
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _align(n: int) -> int:
    """The largest power of two up to 16 dividing n: the row alignment the kernels may assume."""
    return min(16, n & -n)


@functools.lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    """The SMs a persistent grid fills; in the interpreter (CPU tensors) 2, so that its programs walk tiles."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 2


# ----------------------------------------------------------------------------------------------- weight copies

def compute_weight(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`weight` as a contiguous `dtype` tensor for the projections: cast once and cached until it changes, never
    inside a CUDA-graph capture of inference (see `sk.ops.weight_cache`)."""
    return weight_cache.cast(OP, weight, dtype)


def _gate_up_copies(wg: torch.Tensor, wu: torch.Tensor, dtype: torch.dtype):
    """(gate, up, both): the gate and up weights in `dtype`. Masters in another dtype are cast into one cached
    [gate; up] copy (`both`; gate and up are its halves), so that the backward's dgrad is one GEMM over
    [dg | du] and the cuBLAS training forward one GEMM; weights already in `dtype` are used as they are
    (`both` None: no second copy of them)."""
    if wg.dtype == dtype and wu.dtype == dtype and wg.is_contiguous() and wu.is_contiguous():
        return wg, wu, None
    ff = wg.shape[0]

    def make():
        both = torch.empty((2 * ff, wg.shape[1]), dtype=dtype, device=wg.device)
        both[:ff].copy_(wg.detach())
        both[ff:].copy_(wu.detach())
        return both
    both = weight_cache.derived(OP, (wg, wu), ("gate_up", dtype), make)
    return both[:ff], both[ff:], both


# Inference calls fold the LayerNorm scale into cached gate/up weights (`_folded_gate_up`), so that the gate/up
# kernel is a plain GEMM (both operands from shared memory). It costs a second copy of those weights per dtype;
# SK_GEGLU_FOLD_LN=0 (`sk.settings`, "geglu_fold_ln") turns it off (then inference runs as training's forward does).
def _folded_gate_up(ln_w, ln_b, wg, bg, wu, bu, dtype):
    """(W', fold): W' = γ⊙W of gate and up in `dtype`, their rows interleaved (gate 0, up 0, gate 1, ...: the
    gate/up kernel computes both with one product), and fold fp32 [[Σ_k W'], [W·β + b]], its columns
    interleaved alike, so that for a row x with mean μ and 1/std r

        gate = r·(x @ W'_gateᵀ − μ·Σ_k W'_gate) + (W_gate·β + b_gate)      (up alike)

    is LayerNorm followed by the projection. The row sums are of the rounded W', so the mean cancels exactly
    in real arithmetic. What remains is the fp32 accumulation error of x @ W'ᵀ, which is relative to μ rather
    than to the centered values: about d_model·2⁻²⁴·|μ|/σ of the output (5e-5·|μ|/σ at d_model = 768),
    below a bf16 rounding (3.9e-3) unless rows are nearly constant (|μ|/σ ≳ 30). Training keeps the prologue
    that normalizes x tiles in fp32, which has no such term.

    Cached by `sk.ops.weight_cache` on all six sources (inference tensors included). None for traced tensors
    and during a CUDA-graph capture that finds no fold made before it (the graph would recompute it on every
    replay): the kernel then normalizes in its prologue. Making a fold takes two fp32 temporaries the size of
    gate + up (about 0.5 GB at d_model 2048, d_ff 16384).
    """
    sources = (ln_w, ln_b, wg, bg, wu, bu)
    if any(t is not None and type(t) not in (torch.Tensor, torch.nn.Parameter) for t in sources):
        return None
    tag = ("geglu_fold", dtype)
    if wg.is_cuda and torch.cuda.is_current_stream_capturing() and not weight_cache.is_cached(sources, tag):
        return None
    return weight_cache.derived(OP, sources, tag, lambda: _fold(ln_w, ln_b, wg, bg, wu, bu, dtype))


def _fold(ln_w, ln_b, wg, bg, wu, bu, dtype):
    ff, d = wg.shape
    with torch.no_grad(), torch.autocast(wg.device.type, enabled=False):  # fp32 throughout, also under autocast
        w = torch.stack([wg, wu], dim=1).reshape(2 * ff, d).float()  # rows interleaved: gate 0, up 0, gate 1, ...
        folded = (w * ln_w.float()).to(dtype)
        fold = torch.zeros((2, 2 * ff), dtype=torch.float32, device=w.device)
        torch.sum(folded, 1, dtype=torch.float32, out=fold[0])
        if ln_b is not None:
            torch.mv(w, ln_b.float(), out=fold[1])
        for b, cols in ((bg, fold[1, 0::2]), (bu, fold[1, 1::2])):
            if b is not None:
                cols += b.float()
    return folded, fold


# ----------------------------------------------------------------------------------------------- launchers

CHECK_DESCRIPTORS = settings.get("triton_interpret")  # see _descriptor
# Programmatic dependent launch (Hopper), where the gate/up config's `dependent_launch` asks for it: the gate/up
# and down kernels are launched while the kernel before them still runs, so that their launch and set-up (and,
# with the fold, gate/up's whole GEMM) overlap it; each waits (gdc_wait) before touching what that kernel
# writes. The statistics kernel launches dependently on whatever kernel runs before the op, but waits for it
# to finish before touching memory and only then lets gate/up launch, so nothing of the op's memory traffic
# overlaps the caller's kernels: what it gains is its own launch, hidden behind the end of the kernel before
# (where that kernel lets dependents launch early, as QuACK's down GEMM does after its tile loop). Gate/up then
# reads x through L2, where the finished kernel's writes are (the PTX model promises them only to the grid that
# waited). Not in the interpreter (no inline PTX); SK_GEGLU_PDL=0 (`sk.settings`, "geglu_pdl") turns it off.
def _pdl_on() -> bool:
    return settings.get("geglu_pdl") and not settings.get("triton_interpret")


# QuACK's CuTe-DSL GEMMs (`fused_pre_norm_geglu_cute`) run inference on folded weights in the shape classes they
# have configs for, where they can run (see `_cute_gemms_on`); SK_GEGLU_CUTE=0 ("geglu_cute") keeps the Triton
# GEMMs there too.
def _cute_on() -> bool:
    return settings.get("geglu_cute") and not settings.get("triton_interpret")


@functools.lru_cache(maxsize=16)
def _cute_gemms_on(device: torch.device):
    """The CuTe-DSL GEMM module where it runs on `device` (compute capability 9.0, QuACK installed), else None."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) != (9, 0):
        return None
    try:
        return importlib.import_module("sk.ops.fused_pre_norm_geglu_cute")
    except ImportError:  # QuACK not installed (`pip install standardkernels[cute]`): the Triton GEMMs run
        return None
    except Exception as e:  # installed but broken (a version mismatch, ...): said once, then the Triton GEMMs
        warnings.warn(f"sk.ops.{OP}: QuACK's GEMMs failed to load ({type(e).__name__}: {e}); running the Triton "
                      "GEMMs instead", RuntimeWarning)
        return None


def _cute_gemms_for(device: torch.device, m: int, d: int, ff: int, folded: bool):
    """The CuTe-DSL GEMM module if it takes this forward's GEMMs (inference on folded weights, in a shape class
    it has configs for, where it runs, `_cute_on()`), else None."""
    if not (folded and _cute_on()):
        return None
    cute_gemms = _cute_gemms_on(device)
    return cute_gemms if cute_gemms is not None and shape_class(m, d, ff) in cute_gemms.GATE_UP_CONFIGS else None


def _descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    """`TensorDescriptor.from_tensor(t, block)` without its checks (a few µs each, seven descriptors a call),
    which hold by construction here: a 16-byte-aligned base (`_tma_ready`, fresh allocations), rows of a
    multiple of 8 elements (`_shape_miss`), contiguous rows, at least one row, power-of-two blocks. Under the
    interpreter (the CPU tests) the checks run."""
    if CHECK_DESCRIPTORS:
        return TensorDescriptor.from_tensor(t, block)
    desc = object.__new__(TensorDescriptor)
    desc.base, desc.shape, desc.strides, desc.block_shape, desc.padding = t, t.shape, t.stride(), block, "zero"
    return desc


def _forward_kernels(x2, ln_w, ln_b, wg, bg, wu, bu, wd, bd, eps, approximate, save_for_backward,
                     configs: tuple[GemmConfig, GemmConfig] | None = None, fold: torch.Tensor | None = None):
    """Run the three forward kernels. Returns (y, stats, xn, gu); xn and gu are empty unless saving.
    With `fold` (from `_folded_gate_up`; inference only, not with save_for_backward), wg is the folded gate/up
    weight that comes with it (rows interleaved) and wu is None; then, without explicit `configs`, QuACK's
    GEMMs take the gate/up and down products where they run (`_cute_on()`)."""
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
    cute_gemms = _cute_gemms_for(dev, m, d, ff, fold is not None and configs is None)
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
    pdl_on = _pdl_on()
    pdl = pdl_on and cute_gemms is None and gate_up.dependent_launch != "none"
    # QuACK's GEMMs launch dependently and wait for the kernel before them (gate/up in its epilogue, see
    # `fused_pre_norm_geglu_cute`), so the statistics kernel may let gate/up launch at its start there too: its
    # launch, set-up and main loop overlap the statistics
    # (results/h200/geglu/2026-12-01/tenth-run/experiments/stats_pdl.json). The statistics kernel's own dependent
    # launch (see `_pdl_on`): results/h200/geglu/2026-12-01/twelfth-run/experiments/stats_dependent_launch.json.
    stats_pdl = pdl_on and (cute_gemms is not None or pdl)
    d_align, ff_align = _align(d), _align(ff)
    approx_tanh = approximate == "tanh"
    tiles = _cdiv(m, down.block_m) * _cdiv(d, down.block_n)
    if down.split_k > 1:
        # One fp32 partial per split, then one arrival counter per tile (zeroed by the stats kernel).
        scratch = torch.empty(down.split_k * m * d + tiles, dtype=torch.float32, device=dev)
        partial, arrivals = scratch[: down.split_k * m * d], scratch[down.split_k * m * d:].view(torch.int32)
    else:
        partial, arrivals = y, stats  # unread without a split

    block_d = _next_power_of_2(d)
    rows_per_program = max(1, min(16, 2048 // block_d))
    _ln_stats_kernel[(_cdiv(m, rows_per_program),)](
        x2, stats, ln_w, ln_b, xn, arrivals, m, d, eps, tiles,
        D_ALIGN=d_align, HAS_LN_BIAS=ln_b is not None, STORE_XN=save_for_backward,
        ARRIVALS_BLOCK=max(16, _next_power_of_2(tiles)) if down.split_k > 1 else 0, PDL=stats_pdl,
        BLOCK_M=rows_per_program, BLOCK_D=block_d,
        num_warps=min(16, max(1, rows_per_program * block_d // 512)), launch_pdl=stats_pdl,
    )

    if cute_gemms is not None:
        cute_gemms.gate_up(x2, stats, wg, fold, h, approximate, size_class)
        cute_gemms.down(h, wd, bd, x2, y, size_class)
        return y, stats, xn, gu
    c = gate_up
    tma = _descriptor  # zero-filled past the edges; blocks as the kernel's tiles
    programs = _cdiv(m, c.block_m) * _cdiv(ff, c.block_n)  # one per tile, or (persistent) a few per SM
    if c.programs_per_sm:
        programs = min(programs, c.programs_per_sm * _sm_count(dev))
    _gate_up_kernel[(programs,)](
        tma(x2, [c.block_m, c.block_k]), stats, ln_w, ln_b,
        *((tma(wg, [2 * c.block_n, c.block_k]),) * 2 if fold is not None else
          (tma(wg, [c.block_n, c.block_k]), tma(wu, [c.block_n, c.block_k]))), bg, bu,
        fold if fold is not None else stats, h,  # stats: unread without FOLD_LN
        tma(h, [c.block_m, c.block_n]) if c.tma_store else h, gu, m, d, ff,
        FF_ALIGN=ff_align, K_BLOCKS=_cdiv(d, c.block_k), FOLD_LN=fold is not None,
        HAS_LN_BIAS=ln_b is not None, HAS_GATE_BIAS=bg is not None, HAS_UP_BIAS=bu is not None,
        STORE_PREACT=save_for_backward, APPROX_TANH=approx_tanh, SWAP_AB=c.swap_ab and fold is not None, PDL=pdl,
        DOWN_AT_START=c.dependent_launch == "at_start", PERSISTENT=c.programs_per_sm > 0, TMA_STORE=c.tma_store,
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
        num_warps=c.num_warps, num_stages=c.num_stages, launch_pdl=pdl,
    )

    c = down
    _down_kernel[(tiles, c.split_k)](
        tma(h, [c.block_m, c.block_k]), tma(wd, [c.block_n, c.block_k]), bd,
        tma(x2, [c.block_m, c.block_n]), tma(y, [c.block_m, c.block_n]), partial, arrivals, m, d,
        K_BLOCKS_PER_SPLIT=_cdiv(_cdiv(ff, c.block_k), c.split_k), HAS_BIAS=bd is not None, SPLIT_K=c.split_k,
        SWAP_AB=c.swap_ab, PDL=pdl,
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
        num_warps=c.num_warps, num_stages=c.num_stages, launch_pdl=pdl,
    )
    return y, stats, xn, gu


def _geglu_backward_act(dh: torch.Tensor, gu: torch.Tensor, d_model: int, approximate: str
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(d[g | u], h) from the upstream gradient dh and the saved pre-activations [g | u].

    Decides kernel vs PyTorch for the whole backward (recorded once per backward, here), as the LayerNorm
    backward below follows the same inputs.
    """
    m, ff = dh.shape
    if not coverage.decide(OP, (dh, gu), shape_miss=_shape_miss(d_model, ff), backward=True):
        acc_dtype = torch.promote_types(gu.dtype, torch.float32)
        g, u = gu.to(acc_dtype).split(ff, dim=-1)
        dhf = dh.to(acc_dtype)
        act = torch.nn.functional.gelu(g, approximate=approximate)
        dg = torch.ops.aten.gelu_backward(dhf * u, g, approximate=approximate)
        return torch.cat([dg, dhf * act], dim=-1).to(dh.dtype), (act * u).to(dh.dtype)
    dgu = torch.empty_like(gu)
    h = torch.empty_like(dh)
    if m:
        block = min(2048, _next_power_of_2(ff))
        _geglu_backward_kernel[(m, _cdiv(ff, block))](
            dh, gu, dgu, h, m, ff, FF_ALIGN=_align(ff), APPROX_TANH=approximate == "tanh", BLOCK=block,
            num_warps=max(1, min(8, block // 256)),
        )
    return dgu, h


LN_BACKWARD_PROGRAMS = 256  # about two per SM: fewer partial rows to sum, enough programs to fill the GPU


def _ln_backward(dxn: torch.Tensor, x: torch.Tensor, dy: torch.Tensor, stats: torch.Tensor,
                 ln_weight: torch.Tensor, ff: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, [d ln_weight; d ln_bias; d down_bias]) from the normalized activation's gradient dxn and the
    output's dy: LayerNorm's backward plus the residual's dy, and the column sums that are the LayerNorm
    weight and bias grads and the down projection's bias grad, in the statistics' dtype (fp32; fp64 for
    fp64 inputs)."""
    m, d = x.shape
    if coverage.miss_reason(OP, x, shape_miss=_shape_miss(d, ff), backward=True) is not None:
        acc = stats.dtype  # the miss was recorded (or raised) by _geglu_backward_act for this backward
        dxn_acc = dxn.to(acc)
        dx_ln, d_ln_w, _ = torch.ops.aten.native_layer_norm_backward(
            dxn_acc, x.to(acc), [d], stats[0].view(m, 1), stats[1].view(m, 1), ln_weight.to(acc), None,
            [True, True, False])
        return (dx_ln + dy).to(x.dtype), torch.stack([d_ln_w, dxn_acc.sum(0), dy.sum(0, dtype=acc)])
    dx = torch.empty_like(x)
    if m == 0:
        return dx, torch.zeros((3, d), dtype=torch.float32, device=x.device)
    programs, meta = ln_backward_launch(m, d)
    partial = torch.empty((3, programs, d), dtype=torch.float32, device=x.device)
    _ln_backward_kernel[(programs,)](dxn, x, dy, stats, ln_weight, dx, partial, m, d, **meta)
    return dx, partial.sum(1)


def ln_backward_launch(m: int, d: int) -> tuple[int, dict]:
    """Programs and compile-time parameters of `_ln_backward_kernel` for m rows of d_model d."""
    block_d = _next_power_of_2(d)
    rows_per_block = max(1, min(16, 2048 // block_d))
    iters = _next_power_of_2(_cdiv(_cdiv(m, rows_per_block), LN_BACKWARD_PROGRAMS))
    # 8 elements a thread per row tile: six such tiles live at once, without spills on sm90 up to d_model 2048
    # (16 and 32 bytes at 4096 and 8192, where registers per thread run out; benchmarks/compile_report_geglu.py).
    return _cdiv(m, rows_per_block * iters), dict(
        D_ALIGN=_align(d), ITERS=iters, BLOCK_M=rows_per_block, BLOCK_D=block_d,
        num_warps=min(32, max(1, rows_per_block * block_d // 256)))


# Custom ops of their own so that the backward traces (torch.compile) and decides per call; eager backwards
# call the functions directly (see `_eager`).
_geglu_backward_act_op = torch.library.custom_op(
    "sk::fused_pre_norm_geglu_backward_act", mutates_args=())(_geglu_backward_act)
_ln_backward_op = torch.library.custom_op("sk::fused_pre_norm_geglu_backward_ln", mutates_args=())(_ln_backward)


@_geglu_backward_act_op.register_fake
def _(dh, gu, d_model, approximate):
    return torch.empty_like(gu), torch.empty_like(dh)


@_ln_backward_op.register_fake
def _(dxn, x, dy, stats, ln_weight, ff):
    return torch.empty_like(x), stats.new_empty((3, x.shape[1]))


# ----------------------------------------------------------------------------------------------- reference

def _reference_parts(x2, ln_w, ln_b, wg, bg, wu, bu, wd, bd, eps, approximate):
    """PyTorch computing what the kernels compute, with the same roundings: (y, stats, xn, gu).

    The fallback, and (through `fused_pre_norm_geglu_reference`) the test oracle when run in fp64; it is
    differentiable in every input.
    """
    dtype = x2.dtype
    xf = x2 if dtype == torch.float64 else x2.float()
    mean = xf.mean(-1, keepdim=True)
    centered = xf - mean
    rstd = torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + eps)
    xn = centered * rstd * ln_w.to(xf.dtype)
    if ln_b is not None:
        xn = xn + ln_b.to(xf.dtype)
    xn = xn.to(dtype)
    biases = None if bg is None and bu is None else torch.cat([
        bg if bg is not None else wg.new_zeros(wg.shape[0]), bu if bu is not None else wu.new_zeros(wu.shape[0])])
    gu = torch.nn.functional.linear(
        xn, torch.cat([wg, wu]).to(dtype), None if biases is None else biases.to(dtype))
    g, u = gu.to(xf.dtype).chunk(2, dim=-1)
    h = (torch.nn.functional.gelu(g, approximate=approximate) * u).to(dtype)
    down = torch.nn.functional.linear(h, wd.to(dtype)).to(xf.dtype)
    if bd is not None:
        down = down + bd.to(xf.dtype)
    y = (xf + down).to(dtype)
    return y, torch.cat([mean, rstd], dim=-1).t().contiguous(), xn, gu


def fused_pre_norm_geglu_reference(x, ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias,
                                   down_weight, down_bias, eps, approximate="none"):
    """The PyTorch computation the op replaces: fallback, test oracle and benchmark baseline."""
    x2 = x.reshape(-1, x.shape[-1])
    y = _reference_parts(x2, ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias,
                         down_weight, down_bias, eps, approximate)[0]
    return y.view(x.shape)


# ----------------------------------------------------------------------------------------------- custom op

@functools.lru_cache(maxsize=64)
def _shape_miss(d: int, ff: int) -> str | None:
    limits = coverage.table()[OP].limits
    if d % TMA_ALIGN or ff % TMA_ALIGN or not d or not ff:  # TMA needs 16-byte row strides, and rows
        return f"d_model {d} and d_ff {ff} must be positive multiples of {TMA_ALIGN}"
    return (coverage.limit_miss("d_model", d, limits.get("max_d_model"))
            or coverage.limit_miss("d_ff", ff, limits.get("max_d_ff")))


def _forward(
    x: torch.Tensor, ln_weight: torch.Tensor, ln_bias: Optional[torch.Tensor],
    gate_weight: torch.Tensor, gate_bias: Optional[torch.Tensor],
    up_weight: torch.Tensor, up_bias: Optional[torch.Tensor],
    down_weight: torch.Tensor, down_bias: Optional[torch.Tensor],
    eps: float, approximate: str, save_for_backward: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x is 2-D and contiguous. Returns (y, [mean; rstd], normalized x, [g | u]); the last two are empty
    unless saving for the backward (custom ops cannot return None)."""
    m, d = x.shape
    ff = gate_weight.shape[0]
    tensors = (x, ln_weight, gate_weight, up_weight, down_weight)
    if not coverage.decide(OP, tensors, shape_miss=_shape_miss(d, ff)):
        y, stats, xn, gu = _reference_parts(x, ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias,
                                            down_weight, down_bias, eps, approximate)
        return (y, stats) + ((xn, gu) if save_for_backward else (x.new_empty(0), x.new_empty(0)))
    folded = None if save_for_backward or not settings.get("geglu_fold_ln") else _folded_gate_up(
        ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias, x.dtype)
    if folded is None:
        wg, wu, both = _gate_up_copies(gate_weight, up_weight, x.dtype)
        wg, wu, fold = _tma_ready(wg), _tma_ready(wu), None
    else:
        (wg, fold), wu = folded, None
    wd = compute_weight(down_weight, x.dtype)
    if save_for_backward and _cublas_training(m, d, ff):
        return _forward_cublas(x, ln_weight, ln_bias, wg, gate_bias, wu, up_bias, both, wd, down_bias, eps,
                               approximate)
    # The down bias is read as a contiguous vector (QuACK's from a 16-byte boundary too); rarely a copy.
    bd = None if down_bias is None else _tma_ready(down_bias.contiguous())
    return _forward_kernels(
        _tma_ready(x), ln_weight, ln_bias, wg, gate_bias, wu, up_bias,
        _tma_ready(wd), bd, eps, approximate, save_for_backward, fold=fold)


def _cublas_training(m: int, d: int, ff: int) -> bool:
    """Whether a training forward runs its products on cuBLAS (`SK_GEGLU_TRAIN_GEMMS`, "geglu_train_gemms")."""
    mode = settings.get("geglu_train_gemms")
    return mode == "cublas" or (mode == "auto" and m * d * ff > STEP_GRAPH_MAX_WORK)


def _forward_cublas(x, ln_w, ln_b, wg, bg, wu, bu, both, wd, bd, eps, approximate):
    """The training forward as our LayerNorm kernel (statistics and the normalized activation, which the backward
    keeps), one cuBLAS GEMM for [g | u] (the saved pre-activations are its output), our GEGLU kernel, and one
    cuBLAS GEMM adding the residual in its epilogue. Returns what `_forward_kernels` returns."""
    m, d = x.shape
    ff = wd.shape[1]
    dtype = x.dtype
    stats = torch.empty((2, m), dtype=torch.float32, device=x.device)
    xn = torch.empty((m, d), dtype=dtype, device=x.device)
    if m:
        block_d = _next_power_of_2(d)
        rows_per_program = max(1, min(16, 2048 // block_d))
        _ln_stats_kernel[(_cdiv(m, rows_per_program),)](
            x, stats, ln_w, ln_b, xn, stats, m, d, eps, 0,
            D_ALIGN=_align(d), HAS_LN_BIAS=ln_b is not None, STORE_XN=True, ARRIVALS_BLOCK=0, PDL=False,
            BLOCK_M=rows_per_program, BLOCK_D=block_d, num_warps=min(16, max(1, rows_per_program * block_d // 512)))
    # Biases in cuBLAS's epilogue (addmm): a separate broadcast add over [g | u] cost 0.77 ms at 8192 × 2048 →
    # 16384 on the H200 (results/h200/geglu/README.md, 2026-12-02).
    if both is None:
        gu = torch.empty((m, 2 * ff), dtype=dtype, device=x.device)
        for w, b, cols in ((wg, bg, gu[:, :ff]), (wu, bu, gu[:, ff:])):
            if b is None:
                torch.mm(xn, w.t(), out=cols)
            else:
                torch.addmm(b.to(dtype), xn, w.t(), out=cols)
    elif bg is None and bu is None:
        gu = xn @ both.t()
    else:
        bias = torch.cat([bg if bg is not None else wg.new_zeros(ff), bu if bu is not None else wu.new_zeros(ff)])
        gu = torch.addmm(bias.to(dtype), xn, both.t())
    h = torch.empty((m, ff), dtype=dtype, device=x.device)
    if m:
        _act_launch(gu, h, "gelu_tanh" if approximate == "tanh" else "gelu")
    residual = x if bd is None else (x.float() + bd.float()).to(dtype)
    return torch.addmm(residual, h, wd.t()), stats, xn, gu


_fused_pre_norm_geglu_op = torch.library.custom_op("sk::fused_pre_norm_geglu", mutates_args=())(_forward)


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    """`t` itself when it starts on a 16-byte boundary, as TMA requires; otherwise an aligned copy (rare: a
    view starting mid-row)."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


@_fused_pre_norm_geglu_op.register_fake
def _(x, ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias, eps,
      approximate, save_for_backward):
    m, d = x.shape
    ff = gate_weight.shape[0]
    stats_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    saved = (x.new_empty((m, d) if save_for_backward else 0), x.new_empty((m, 2 * ff) if save_for_backward else 0))
    return (x.new_empty((m, d)), x.new_empty((2, m), dtype=stats_dtype), *saved)


def _setup_context(ctx, inputs, output):
    x, ln_w, ln_b, wg, bg, wu, bu, wd, bd, eps, approximate, _ = inputs
    _, stats, xn, gu = output
    ctx.approximate = approximate
    ctx.save_for_backward(x, ln_w, wg, wu, wd, stats, xn, gu)
    ctx.bias_dtypes = [b.dtype if b is not None else None for b in (ln_b, bg, bu, bd)]  # their grads are sums


def _setup_op_context(ctx, inputs, output):
    _setup_context(ctx, inputs, output)
    ctx.mark_non_differentiable(*output[1:])


def _backward(ctx, dy, *_):
    x, ln_w, wg, wu, wd, stats, xn, gu = ctx.saved_tensors
    if xn.numel() != x.numel():
        raise RuntimeError(f"sk.ops.{OP}: backward through a call made without autograd state; call it with "
                           f"grad mode on and an input that requires grad")
    ff = wg.shape[0]
    dtype = x.dtype
    # The kernels and cuBLAS read dy as dense rows; `.to` alone would keep an expanded dy (`y.sum().backward()`).
    dy = dy.to(dtype).contiguous()
    cwg, cwu, both = _gate_up_copies(wg, wu, dtype)
    cwd = compute_weight(wd, dtype)
    need = ctx.needs_input_grad
    eager = _eager(dy)

    dh = dy @ cwd
    dgu, h = (_geglu_backward_act if eager else _geglu_backward_act_op)(dh, gu, x.shape[1], ctx.approximate)
    if both is not None:  # one GEMM over [dg | du] and [gate; up]
        dxn = dgu @ both
    else:
        dxn = dgu[:, :ff] @ cwg
        dxn.addmm_(dgu[:, ff:], cwu)
    dx, d_ln = (_ln_backward if eager else _ln_backward_op)(dxn, x, dy, stats, ln_w, ff)
    acc = stats.dtype  # fp32 (fp64 for fp64 inputs): every reduction runs in it
    if need[3] or need[5]:  # gate and up weight grads in one GEMM (views of it are the grads)
        d_gu_w = _mm_as(dgu.t(), xn, torch.promote_types(wg.dtype, wu.dtype))
    d_gu_b = dgu.sum(0, dtype=acc) if need[4] or need[6] else None

    ln_b_dtype, bg_dtype, bu_dtype, bd_dtype = ctx.bias_dtypes
    # Each grad in its input's dtype (FP32 for FP32 masters), computed only where autograd asks for it.
    return (
        dx if need[0] else None,
        d_ln[0].to(ln_w.dtype) if need[1] else None,
        d_ln[1].to(ln_b_dtype) if need[2] else None,
        d_gu_w[:ff].to(wg.dtype) if need[3] else None,
        d_gu_b[:ff].to(bg_dtype) if need[4] else None,
        d_gu_w[ff:].to(wu.dtype) if need[5] else None,
        d_gu_b[ff:].to(bu_dtype) if need[6] else None,
        _mm_as(dy.t(), h, wd.dtype) if need[7] else None,
        d_ln[2].to(bd_dtype) if need[8] else None,
        None, None, None,
    )


_fused_pre_norm_geglu_op.register_autograd(_backward, setup_context=_setup_op_context)


def _mm_as(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a @ b in `dtype`: a weight gradient for an FP32 master straight from the fp32 accumulator (one GEMM
    writing fp32, instead of a bf16 product and a cast pass over it) where cuBLAS offers it (`out_dtype`, CUDA
    bf16/fp16 operands); else the product cast."""
    if dtype == torch.float32 and a.dtype in (torch.bfloat16, torch.float16) and a.is_cuda and _mm_out_dtype_ok(a):
        return torch.mm(a, b, out_dtype=torch.float32)
    return (a @ b).to(dtype)


_out_dtype_probes: dict = {}


def _mm_out_dtype_ok(a: torch.Tensor) -> bool:
    """Whether torch.mm takes `out_dtype` for `a`'s dtype and device, probed once outside any capture (inside
    one, unprobed means no: the probe would be captured)."""
    key = (a.dtype, a.device)
    if key not in _out_dtype_probes:
        if torch.cuda.is_current_stream_capturing():
            return False
        try:
            one = torch.ones((1, 1), dtype=a.dtype, device=a.device)
            _out_dtype_probes[key] = torch.mm(one, one, out_dtype=torch.float32).dtype == torch.float32
        except (TypeError, RuntimeError):
            _out_dtype_probes[key] = False
    return _out_dtype_probes[key]


_step_graphs = StepGraphs(OP, _forward, _setup_context, _backward,
                          settings=lambda: (_pdl_on(), settings.get("geglu_train_gemms")))
# Training steps are replayed from CUDA graphs (see `_step_graphs.py`) up to this much work, m·d_model·d_ff:
# there the host's launch cost (~0.3-2 ms a step) is above the kernels' time (18·m·d·ff FLOP, ~0.1 ms at 2^32)
# and a slot's memory stays moderate (160 MiB at the seed shape, m·d·ff ≈ 2^30, growing about in proportion);
# beyond it a step is GPU-bound and replay would gain nothing.
STEP_GRAPH_MAX_WORK = 2 ** 32


class _EagerFunction(torch.autograd.Function):
    """The same forward and backward as the custom op, for eager calls: the custom op's dispatch (schema
    checks, its own autograd wrapper, four outputs through the dispatcher) cost more host time than the
    kernels take on the GPU at the seed shape. torch.compile, fake tensors and functorch take the custom op.
    Repeated small CUDA calls replay their step from CUDA graphs (`_step_graphs`)."""

    @staticmethod
    def forward(ctx, *inputs):
        if _replayable(*inputs):
            y = _step_graphs.forward(ctx, inputs)
            if y is not None:
                return y
        output = _forward(*inputs)
        _setup_context(ctx, inputs, output)
        return output[0]

    @staticmethod
    def backward(ctx, dy):
        return _step_graphs.backward(ctx, dy) if StepGraphs.replays(ctx) else _backward(ctx, dy)


def _replayable(x, ln_weight, ln_bias, gate_weight, *rest) -> bool:
    """A CUDA call on plain tensors (whose memory a graph can read) that the kernels cover (checked without
    recording it), small enough to gain from replay."""
    m, d = x.shape
    ff = gate_weight.shape[0]
    return (x.is_cuda and 0 < m * d * ff <= STEP_GRAPH_MAX_WORK
            and all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in (ln_weight, ln_bias, gate_weight, *rest)
                    if isinstance(t, torch.Tensor))
            and coverage.miss_reason(OP, x, shape_miss=_shape_miss(d, ff)) is None
            and coverage.miss_reason(OP, x, shape_miss=_shape_miss(d, ff), backward=True) is None)


def _eager(x: torch.Tensor) -> bool:
    """True when `x` is a real tensor run eagerly: no tracing, no fake or wrapped tensors, no dispatch mode."""
    return (type(x) is torch.Tensor and not torch.compiler.is_compiling()
            and _get_current_dispatch_mode() is None and not torch._C._are_functorch_transforms_active())


# ----------------------------------------------------------------------------------------------- functional API

def _args_fit(x, ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias, eps,
              approximate) -> bool:
    """The common case, checked in a few comparisons per call; `_explain_args` says what is wrong otherwise."""
    if not (isinstance(x, torch.Tensor) and x.dim() and isinstance(gate_weight, torch.Tensor)
            and gate_weight.dim() == 2 and eps >= 0 and approximate in ("none", "tanh")):
        return False
    d, ff = x.shape[-1], gate_weight.shape[0]
    if not d or not ff:
        return False
    device = x.device
    for t, shape in ((x, None), (ln_weight, (d,)), (ln_bias, (d,)), (gate_weight, (ff, d)), (gate_bias, (ff,)),
                     (up_weight, (ff, d)), (up_bias, (ff,)), (down_weight, (d, ff)), (down_bias, (d,))):
        if t is None:  # a bias (or a missing weight, caught below)
            continue
        if (not isinstance(t, torch.Tensor) or t.dtype not in FLOAT_DTYPES or t.device != device
                or shape is not None and t.shape != shape):
            return False
    return ln_weight is not None and up_weight is not None and down_weight is not None


def _explain_args(x, ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias, eps,
                  approximate):
    named = {"x": x, "ln_weight": ln_weight, "ln_bias": ln_bias, "gate_weight": gate_weight,
             "gate_bias": gate_bias, "up_weight": up_weight, "up_bias": up_bias, "down_weight": down_weight,
             "down_bias": down_bias}
    present = {n: t for n, t in named.items() if t is not None or not n.endswith("bias")}  # biases may be None
    for name, t in present.items():
        check_float(OP, name, t)
    check_same_device(OP, list(present), list(present.values()))
    if x.dim() == 0:
        raise ValueError(f"sk.ops.{OP}: x must have at least one dimension (..., d_model)")
    if gate_weight.dim() != 2:
        raise ValueError(f"sk.ops.{OP}: gate_weight must be (d_ff, d_model); got {tuple(gate_weight.shape)}")
    d, ff = x.shape[-1], gate_weight.shape[0]
    expected = {"ln_weight": (d,), "ln_bias": (d,), "gate_weight": (ff, d), "gate_bias": (ff,),
                "up_weight": (ff, d), "up_bias": (ff,), "down_weight": (d, ff), "down_bias": (d,)}
    wrong = [f"{n} {tuple(present[n].shape)} (expected {shape})" for n, shape in expected.items()
             if n in present and tuple(present[n].shape) != shape]
    if wrong:
        raise ValueError(f"sk.ops.{OP}: with x {tuple(x.shape)} (d_model={d}) and d_ff={ff} from gate_weight, "
                         f"these shapes do not fit: {'; '.join(wrong)}")
    if not d or not ff:
        raise ValueError(f"sk.ops.{OP}: d_model (x's last dim) and d_ff (gate_weight's rows) must be at least 1; got "
                         f"x {tuple(x.shape)} (d_model={d}) and gate_weight {tuple(gate_weight.shape)} (d_ff={ff})")
    if not eps >= 0:
        raise ValueError(f"sk.ops.{OP}: eps must be a non-negative float, got {eps!r}")
    if approximate not in ("none", "tanh"):
        raise ValueError(f"sk.ops.{OP}: approximate must be 'none' or 'tanh', got {approximate!r}")


def fused_pre_norm_geglu(
    x: torch.Tensor,
    ln_weight: torch.Tensor, ln_bias: torch.Tensor | None,
    gate_weight: torch.Tensor, gate_bias: torch.Tensor | None,
    up_weight: torch.Tensor, up_bias: torch.Tensor | None,
    down_weight: torch.Tensor, down_bias: torch.Tensor | None,
    eps: float = 1e-5,
    approximate: str = "none",
) -> torch.Tensor:
    """x + down(gelu(gate(h)) · up(h)), h = layer_norm(x), over the last dimension of x (..., d_model).

    Weights as torch.nn.Linear / LayerNorm store them: gate/up (d_ff, d_model), down (d_model, d_ff); any bias
    may be None. GELU is exact (erf) by default, `approximate="tanh"` as in torch.nn.functional.gelu.
    The kernel runs on bf16/fp16 inputs where the Kernel Coverage table says so: LayerNorm statistics in fp32,
    projections on copies of the weights in the input's dtype, fp32 accumulation. Under autocast an fp32 input
    is converted to the autocast dtype for this op; outside it, an fp32 input takes the recorded fallback.
    """
    args = (ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias, eps, approximate)
    if not _args_fit(x, *args):
        _explain_args(x, *args)
    device_type = x.device.type
    if x.dtype == torch.float32 and torch.is_autocast_enabled(device_type):
        x = x.to(torch.get_autocast_dtype(device_type))
    weights = (ln_weight, ln_bias, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias)
    save = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, *weights))
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    if not _eager(x2):
        y = _fused_pre_norm_geglu_op(x2, *weights, float(eps), approximate, save)[0]
    elif save:
        y = _EagerFunction.apply(x2, *weights, float(eps), approximate, True)
    else:
        y = _forward(x2, *weights, float(eps), approximate, False)[0]
    return y.view(x.shape)
