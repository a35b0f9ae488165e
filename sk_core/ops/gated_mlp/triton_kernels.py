"""Triton kernels of the gated-MLP block (inference: bf16/fp16 on SM90; fp32/fp16 under TRITON_INTERPRET=1 for
the CPU tests), their launchers and the launch-config table. They read the weights as the caller holds them (the
engines' merged [gate; up] included): no copy of any weight is made, so a model costs no more memory with them.

Three kernels per call:
  S. `_norm_kernel`: per row, h = round(x + residual) (stored: the op's residual_out) and the normalized row
     n = round(norm(h)) (stored), statistics in fp32 over the row held in registers, exactly in two passes:
     the engines' add + RMSNorm kernel, with the same roundings.
  A. `_gate_up_kernel`: the gate/up GEMM on n, each tile two products over the same n block (gate rows j..j+H
     and up rows d_ff+j..d_ff+j+H of the weight as given, through two TMA descriptors), both operands from TMA
     into shared memory into the tensor cores untouched; the epilogue adds the biases, computes act(g)·u in
     fp32, rounds once and stores a [M, d_ff]. For small M (`swap_ab`) the products run transposed, W·nᵀ, so
     that the weight tiles take wgmma's 64-row side (H ≥ 64 there) and the few token rows (padded to 16 by TMA's
     zero fill) its narrow side.
  B. `_down_kernel`: out = a @ Wdᵀ (+ bd). When the output has too few tiles to fill the GPU (decode: d_model /
     BLOCK_N tiles), K is split across programs that each write an fp32 partial; the last program to finish a
     tile (an acq_rel atomic counter, zeroed by program 0 of kernel A: no memset launch) sums the partials in
     split order: the same bits every run.
Where the gate/up config asks for it (`dependent_launch`) and not interpreted, the kernels launch as
programmatic dependent launches (Hopper's PDL), as the GEGLU op's do: S waits for the kernel before the op and
then lets A launch; A waits for S before its main loop (it reads n) and lets B launch at its start or after its
stores; B waits for A before reading a.

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
from sk.ops.rms_norm import GEMMA_OFFSET
from sk.ops.gated_mlp.common import (  # noqa: F401 (the kernels call the _-named helpers by name)
    TMA_ALIGN, TileConfig, _split_k_sum, _tile_coords, _tile_product, align, cdiv, descriptor, next_power_of_2,
    sm_count, tma_ready,
)


# ----------------------------------------------------------------------------------------------- kernels

@triton.jit(do_not_specialize=["n_rows", "eps"])
def _norm_kernel(
    x_ptr, r_ptr, w_ptr, b_ptr, h_ptr, n_ptr, n_rows, d, eps, w_offset,
    D_ALIGN: tl.constexpr, HAS_RESIDUAL: tl.constexpr, LAYER: tl.constexpr, HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # n = round((h - mean) * rstd * (w + w_offset) (+ b)); mean = 0 unless LAYER.
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    row_stride = d // D_ALIGN * D_ALIGN  # == d, written so the compiler knows its alignment (wide loads)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    col = tl.arange(0, BLOCK_D)
    cols = col[None, :]
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
        h = tl.where(mask, h - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(h * h, axis=1) / d + eps)
    w = tl.load(w_ptr + col, mask=col < d, other=0.0).to(tl.float32) + w_offset
    n = h * rstd[:, None] * w[None, :]
    if HAS_BIAS:
        n += tl.load(b_ptr + col, mask=col < d, other=0.0).to(tl.float32)[None, :]
    tl.store(n_ptr + offs, n.to(n_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n_rows", "n_arrivals"])
def _gate_up_kernel(
    n_desc, gate_desc, up_desc, bias_ptr, a_ptr, arrivals_ptr, n_rows, ff, n_arrivals,
    FF_ALIGN: tl.constexpr, K_BLOCKS: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
    SWAP_AB: tl.constexpr, PDL: tl.constexpr, DOWN_AT_START: tl.constexpr, ARRIVALS_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr, HALF: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # A tile computes HALF columns of a from HALF gate rows and the HALF up rows of the same columns. TMA
    # zero-fills past every edge (rows past n_rows, k past d_model, rows past d_ff of either half): no masks in
    # the loop; the stores are masked.
    if PDL:
        gdc_wait()  # n comes from the norm kernel
        if DOWN_AT_START:
            gdc_launch_dependents()
    if ARRIVALS_BLOCK > 0:  # the down kernel's split-K arrival counters; it reads them after this grid ends
        if tl.program_id(0) == 0:
            counters = tl.arange(0, ARRIVALS_BLOCK)
            tl.store(arrivals_ptr + counters, tl.zeros((ARRIVALS_BLOCK,), tl.int32), mask=counters < n_arrivals)
    pid_m, pid_n = _tile_coords(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M), tl.cdiv(ff, HALF), GROUP_M)
    row0, col0 = pid_m * BLOCK_M, pid_n * HALF
    acc_g = tl.zeros((HALF, BLOCK_M) if SWAP_AB else (BLOCK_M, HALF), dtype=tl.float32)
    acc_u = tl.zeros((HALF, BLOCK_M) if SWAP_AB else (BLOCK_M, HALF), dtype=tl.float32)
    for k in tl.range(K_BLOCKS, loop_unroll_factor=1):
        a = n_desc.load([row0, k * BLOCK_K])
        wg = gate_desc.load([col0, k * BLOCK_K])
        wu = up_desc.load([col0, k * BLOCK_K])
        if SWAP_AB:
            acc_g = tl.dot(wg, a.T, acc_g)
            acc_u = tl.dot(wu, a.T, acc_u)
        else:
            acc_g = tl.dot(a, wg.T, acc_g)
            acc_u = tl.dot(a, wu.T, acc_u)
    if SWAP_AB:
        acc_g = acc_g.T
        acc_u = acc_u.T
    offs_m = row0 + tl.arange(0, BLOCK_M)
    out_cols = col0 + tl.arange(0, HALF)
    cols_ok = out_cols < ff
    if HAS_BIAS:
        acc_g += tl.load(bias_ptr + out_cols, mask=cols_ok, other=0.0).to(tl.float32)[None, :]
        acc_u += tl.load(bias_ptr + ff + out_cols, mask=cols_ok, other=0.0).to(tl.float32)[None, :]
    out = (activate(acc_g, ACT) * acc_u).to(a_ptr.dtype.element_ty)
    ff_stride = ff // FF_ALIGN * FF_ALIGN  # == ff (alignment known to the compiler: wide stores)
    tl.store(a_ptr + offs_m.to(tl.int64)[:, None] * ff_stride + out_cols[None, :], out,
             mask=(offs_m < n_rows)[:, None] & cols_ok[None, :])
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

    block_n: weight rows per tile (gate/up: block_n / 2 gate rows and as many up rows, so block_n / 2 output
        columns; with swap_ab at least 128, wgmma's 64 rows a half).
    split_k (down only): 1 none, n > 1 exactly n (fewer if K has fewer blocks), 0 automatic: enough splits
        for `split_waves` waves of programs on the GPU's SMs, each split at least 2 K blocks.
    """
    split_waves: float = 2.0


# Shape classes by the number of rows M (the tokens of a step); the table holds one (gate_up, down) pair per
# class, `TUNED` overrides it for a (class, d_model, d_ff). Entries chosen by a sweep on the H200
# (benchmarks/bench_gated_mlp.py --sweep) name its committed result in `source`; the others are Hopper starting
# points, "untuned". Shared memory per stage is (block_m + block_n) · block_k · 2 bytes, at most ~220 KB
# for all stages.
# - m8 / m32 (decode): weight streaming. Products transposed (the weight tile is wgmma's M side, tokens padded
#   to 16/32), 128 weight rows (64 gate, 64 up) × 128 of K a stage, 4 stages (~150 KB in flight per SM, far
#   above what an SM needs to saturate its share of HBM); the down GEMM split over K to ≥ 2 waves of programs
#   (its d_model/128 tiles are a quarter of the SMs); gate/up lets the down kernel launch at its start.
# - m128: 64-row tiles, no swap; down split to fill the GPU.
# - m1024, large (prefill): 128 × 128 / 128 × 256 tiles, 8 warps, grouped row order (GROUP_M 8).
M_CLASSES = ((8, "m8"), (32, "m32"), (128, "m128"), (1024, "m1024"))
# Rows above which the op composes cuBLAS GEMMs with our norm/activation kernels instead (norm "layer" excepted):
# the fused kernels lose from M=128 on (0.60-0.86x at M=128, 0.91-1.05x in prefill: results/h200/gated_mlp/README.md).
FUSED_MAX_M = 32
# Above LARGE_MLP (d_model * d_ff, Gemma-2B's 2048 * 16384) the fused kernels stop at FUSED_MAX_M_LARGE rows: at
# Llama-3-8B's 4096 * 14336 the composed route was faster at M = 32 in all four H200 runs (1-2.5 %), while at
# Llama-3.2-1B and Gemma-2B the fused kernels won there by 3-10 % (results/h200/gated_mlp/README.md, 2026-12-04);
# a block with a tuned "m32" entry in `TUNED` runs them up to FUSED_MAX_M rows again.
LARGE_MLP = 2048 * 16384
FUSED_MAX_M_LARGE = 8


def fused_max_m(d: int, ff: int) -> int:
    """Rows up to which the op runs its fused kernels for a d x ff block (norms "rms" and "gemma_rms")."""
    return FUSED_MAX_M if d * ff <= LARGE_MLP or ("m32", d, ff) in TUNED else FUSED_MAX_M_LARGE


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
_TP4_SWEEP = "results/h100/gated_mlp/2026-12-06/sweep-tp4-hbm/bench_gated_mlp_sweep.json"
_M32_SWEEP = "results/h100/gated_mlp/2026-12-07/sweep-m32/gated_mlp/bench_gated_mlp_sweep.json"
# (class, d_model, d_ff) -> (gate_up, down), each with `source` naming its committed sweep result.
TUNED: dict[tuple[str, int, int], tuple[GemmConfig, GemmConfig]] = {
    # Qwen3-8B, 9-32 rows: this pair ran 106.9 / 108.2 µs against the composed route's 112.6 / 114.0 at 16 / 32
    # rows, side by side (H100); Llama-3-8B's best pair led its composed route by 1.5 % only, so it has none.
    ("m32", 4096, 12288): (
        GemmConfig(32, 128, 128, 4, 4, swap_ab=True, dependent_launch="after_stores", source=_M32_SWEEP),
        GemmConfig(32, 64, 128, 4, 3, split_k=0, split_waves=1.0, swap_ab=True, source=_M32_SWEEP)),
    # Llama-3-8B at TP-4, decode: 56 gate/up programs on 132 SMs want deeper loads (256 of K a stage), the down
    # GEMM 64-row tiles in one wave; the pair timed together ran 36.4 / 37.1 µs against the table's 40.9 / 42.6
    # at 1 / 8 rows (H100, weights read from HBM).
    ("m8", 4096, 3584): (
        GemmConfig(16, 128, 256, 4, 3, swap_ab=True, dependent_launch="at_start", source=_TP4_SWEEP),
        GemmConfig(16, 64, 128, 4, 3, split_k=0, split_waves=1.0, swap_ab=True, source=_TP4_SWEEP)),
}
MAX_SPLIT_K = 16


def shape_class(m: int) -> str:
    return next((name for bound, name in M_CLASSES if m <= bound), "large")


def fit_configs(gate_up: GemmConfig, down: GemmConfig, m: int, d: int, ff: int, sms: int
                ) -> tuple[GemmConfig, GemmConfig]:
    """Both configs fitted to the problem: blocks no larger than it (except gate/up's halves: at least tl.dot's 16
    rows, wgmma's 64 when swapped), down's automatic split resolved."""
    gate_up = gate_up.fitted(m, 2 * ff, d)
    gate_up = dataclasses.replace(gate_up, block_n=max(gate_up.block_n, 128 if gate_up.swap_ab else 32))
    return gate_up, fit_split(down, m, d, ff, sms)


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
    return fit_configs(gate_up, down, m, d, ff, sms)


# ----------------------------------------------------------------------------------------------- launchers

def pdl_on() -> bool:
    """Programmatic dependent launch: on where the config asks, except in the interpreter (no inline PTX) or
    with SK_GATED_MLP_PDL=0."""
    return settings.get("gated_mlp_pdl") and not settings.get("triton_interpret")


def forward_kernels(
    x: torch.Tensor, residual: Optional[torch.Tensor], norm_weight: torch.Tensor, norm_bias: Optional[torch.Tensor],
    gate_up_weight: torch.Tensor, gate_up_bias: Optional[torch.Tensor], down_weight: torch.Tensor,
    down_bias: Optional[torch.Tensor], eps: float, norm: str, activation: str,
    configs: Optional[tuple[GemmConfig, GemmConfig]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the kernels on 2-D contiguous, TMA-ready tensors: x and residual [M, d_model] (residual may be
    None); norm_weight and norm_bias [d_model] (any float dtype: read in fp32; the bias for "layer" only, or
    None); gate_up_weight [2·d_ff, d_model] (gate rows first) and down_weight [d_model, d_ff] in x's dtype;
    gate_up_bias [2·d_ff] and down_bias [d_model] or None. Returns (out, h); h is empty without a residual (it
    is x). `configs` (already fitted, e.g. `fit_configs`) overrides the table: the benchmark's sweep and the
    tests use it. A documented-internal entry point: no argument checks, no coverage decision."""
    m, d = x.shape
    ff = down_weight.shape[1]
    dtype, dev = x.dtype, x.device
    out = torch.empty((m, d), dtype=dtype, device=dev)
    h = torch.empty((m, d) if residual is not None else 0, dtype=dtype, device=dev)
    if m == 0:
        return out, h
    gate_up, down = configs or choose_configs(m, d, ff, sm_count(dev))
    pdl = pdl_on() and gate_up.dependent_launch != "none"
    n = torch.empty((m, d), dtype=dtype, device=dev)
    a = torch.empty((m, ff), dtype=dtype, device=dev)
    tiles = cdiv(m, down.block_m) * cdiv(d, down.block_n)
    if down.split_k > 1:
        scratch = torch.empty(down.split_k * m * d + tiles, dtype=torch.float32, device=dev)
        partial, arrivals = scratch[: down.split_k * m * d], scratch[down.split_k * m * d:].view(torch.int32)
    else:
        partial, arrivals = out, out  # unread without a split

    block_d = next_power_of_2(d)
    rows_per_program = max(1, min(16, 2048 // block_d))
    has_norm_bias = norm == "layer" and norm_bias is not None
    _norm_kernel[(cdiv(m, rows_per_program),)](
        x, residual if residual is not None else x, norm_weight, norm_bias if has_norm_bias else norm_weight, h, n,
        m, d, eps, GEMMA_OFFSET if norm == "gemma_rms" else 0.0,
        D_ALIGN=align(d), HAS_RESIDUAL=residual is not None, LAYER=norm == "layer", HAS_BIAS=has_norm_bias,
        PDL=pdl, BLOCK_M=rows_per_program, BLOCK_D=block_d,
        num_warps=min(16, max(1, rows_per_program * block_d // 512)), launch_pdl=pdl,
    )

    c = gate_up
    half = c.block_n // 2
    _gate_up_kernel[(cdiv(m, c.block_m) * cdiv(ff, half),)](
        descriptor(n, [c.block_m, c.block_k]), descriptor(gate_up_weight[:ff], [half, c.block_k]),
        descriptor(gate_up_weight[ff:], [half, c.block_k]),
        gate_up_bias if gate_up_bias is not None else n, a, arrivals, m, ff, tiles,
        FF_ALIGN=align(ff), K_BLOCKS=cdiv(d, c.block_k), HAS_BIAS=gate_up_bias is not None, ACT=activation,
        SWAP_AB=c.swap_ab, PDL=pdl, DOWN_AT_START=c.dependent_launch == "at_start",
        ARRIVALS_BLOCK=max(16, next_power_of_2(tiles)) if down.split_k > 1 else 0,
        BLOCK_M=c.block_m, HALF=half, BLOCK_K=c.block_k, GROUP_M=c.group_m,
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


# (class, N, K) -> the split-K config measured faster than cuBLAS there (`source`: its committed sweep, weights
# read from HBM). `sk.ops.linear(backend="auto")` runs the kernel only at these; elsewhere cuBLAS, which was as fast
# or faster (Llama-3.2-1B's projections, any shape at 32 rows).
# Llama-3-8B's QKV and output projections at 1-8 rows: 64-row tiles, K split for one wave (2-3 splits);
# 19.9 / 14.4 µs against cuBLAS's 20.5 / 16.1 at one row (H100).
_LINEAR_SWEEP = "results/h100/ops/2026-12-06/linear-sweep/bench_linear_sweep.json"
LINEAR_TUNED: dict[tuple[str, int, int], GemmConfig] = {
    ("m8", n, 4096): GemmConfig(16, 64, 128, 4, 3, split_k=0, split_waves=1.0, swap_ab=True, source=_LINEAR_SWEEP)
    for n in (6144, 4096)
}


def linear_tuned(m: int, n: int, k: int) -> bool:
    """Whether the split-K kernel was measured faster than cuBLAS for m rows of an [n, k] weight (`LINEAR_TUNED`)."""
    return (shape_class(m), n, k) in LINEAR_TUNED


def linear_config(m: int, n: int, k: int, sms: int) -> GemmConfig:
    """The split-K config of `sk.ops.linear` for m rows of an [n, k] weight: its tuned entry (`LINEAR_TUNED`), else
    the down GEMM's decode class (`DOWN_CONFIGS`); the K split resolved to fill the GPU."""
    cls = shape_class(m)
    return fit_split(LINEAR_TUNED.get((cls, n, k)) or DOWN_CONFIGS[cls], m, n, k, sms)


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
norm_kernel = _norm_kernel
gate_up_kernel = _gate_up_kernel
down_kernel = _down_kernel
