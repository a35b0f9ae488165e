"""What the family's ops share: the GEMM tile config, the Triton tile helpers both ops' kernels call, and the
host-side helpers of their launchers (TMA descriptors, integer maths, SM count, eager detection).

One copy of each, imported by `geglu_kernels` (the pre-norm GEGLU op's kernels) and `triton_kernels` (the
engine-form gated MLP's); the kernels call `_tile_coords` / `_tile_product` / `_split_k_sum` under these names.
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from sk import settings
from sk.ops._common import cdiv, next_power_of_2  # noqa: F401  (this family's host helpers)

TMA_ALIGN = 8  # elements: the GEMM operands' rows must start on 16-byte boundaries for TMA


# ----------------------------------------------------------------------------------------------- tile config

@dataclasses.dataclass(frozen=True)
class TileConfig:
    """Tile shape and launch of one GEMM kernel; each op's `GemmConfig` adds its own knobs.

    split_k (down projections only): 1 none, n > 1 split K over n programs (each op says how it resolves 0).
    swap_ab: W·xᵀ rather than x·Wᵀ, for tiles of fewer than wgmma's 64 rows.
    dependent_launch (gate/up only, read for the whole call): "none" (plain stream order), "at_start" (the down
        kernel launches once every gate/up program started) or "after_stores" (as the gate/up programs finish).
    source: the committed result this entry was chosen from, or "untuned" (provenance: not compared, not a
        launch parameter).
    """
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    split_k: int = 1
    swap_ab: bool = False
    dependent_launch: str = "none"
    source: str = dataclasses.field(default="untuned", compare=False)

    def fitted(self, m: int, n: int, k: int):
        """The same config with blocks no larger than the problem (16 is tl.dot's smallest side), swapped only
        where the rows fall below wgmma's 64."""
        def fit(block, size):
            return min(block, max(16, next_power_of_2(size)))
        block_m = fit(self.block_m, m)
        return dataclasses.replace(self, block_m=block_m, block_n=fit(self.block_n, n), block_k=fit(self.block_k, k),
                                   swap_ab=self.swap_ab and block_m < 64)


# ----------------------------------------------------------------------------------------------- Triton helpers

@triton.jit
def _tile_coords(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """Grouped ordering: GROUP_M row tiles walk the columns together, so their operands stay in L2."""
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    return first_m + (pid % width) % size_m, (pid % width) // size_m


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


@triton.jit
def _split_k_sum(acc, partial_ptr, arrivals_ptr, tile, pid_m, pid_n, n_rows, d, SPLIT_K: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Serial split-K as CUTLASS's: each split stores its fp32 partial of the tile (partial is [SPLIT_K, n_rows,
    d]), a barrier, one release (the tile's arrival counter, zeroed before the kernel); the program that
    arrives last acquires it and sums the partials in split order: the same bits every run. Returns (the sum,
    whether this program is that last one); the others' first value is their own partial."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m < n_rows)[:, None] & (offs_n < d)[None, :]
    partial_ptrs = partial_ptr + offs_m.to(tl.int64)[:, None] * d + offs_n[None, :]
    split_stride = n_rows.to(tl.int64) * d
    tl.store(partial_ptrs + tl.program_id(1) * split_stride, acc, mask=mask)
    tl.debug_barrier()  # every thread's partial is in before the tile's arrival is counted
    arrived = tl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel")
    last = arrived == SPLIT_K - 1
    if last:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for split in tl.static_range(SPLIT_K):
            acc += tl.load(partial_ptrs + split * split_stride, mask=mask, other=0.0, cache_modifier=".cg")
    return acc, last


# ----------------------------------------------------------------------------------------------- host helpers

def align(n: int) -> int:
    """The largest power of two up to 16 dividing n: the row alignment the kernels may assume."""
    return min(16, n & -n)


@functools.lru_cache(maxsize=16)
def sm_count(device: torch.device, interpreted: int = 4) -> int:
    """The GPU's SMs; `interpreted` for CPU tensors (Triton's interpreter), so that the CPU tests see what many
    SMs cause: persistent programs walking several tiles, automatic K splits."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else interpreted


def tma_ready(t: torch.Tensor) -> torch.Tensor:
    """`t` itself when it starts on a 16-byte boundary, as TMA requires; otherwise an aligned copy (rare: a
    view starting mid-row)."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


CHECK_DESCRIPTORS = settings.get("triton_interpret")  # see `descriptor`


def descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    """`TensorDescriptor.from_tensor(t, block)` without its checks (a few µs each, up to seven descriptors a
    call), which hold by construction here: a 16-byte-aligned base (`tma_ready`, fresh allocations), rows of a
    multiple of 8 elements (the ops' shape checks), contiguous rows, at least one row, power-of-two blocks.
    Under the interpreter (the CPU tests) the checks run (`CHECK_DESCRIPTORS`)."""
    if CHECK_DESCRIPTORS:
        return TensorDescriptor.from_tensor(t, block)
    desc = object.__new__(TensorDescriptor)
    desc.base, desc.shape, desc.strides, desc.block_shape, desc.padding = t, t.shape, t.stride(), block, "zero"
    return desc


def is_eager(x: torch.Tensor) -> bool:
    """True when `x` is a real tensor run eagerly: no tracing, no fake or wrapped tensors, no dispatch mode (the
    custom ops' dispatch may be skipped)."""
    return (type(x) is torch.Tensor and not torch.compiler.is_compiling()
            and _get_current_dispatch_mode() is None and not torch._C._are_functorch_transforms_active())
