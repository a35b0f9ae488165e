"""The QuACK CuTe-DSL GEMM backend of the GEGLU op, behind one check: `available(device)` is the backend module
(`quack_gemms`) where it may run, else None, and then the op runs its Triton GEMMs.

    gemms = quack_backend.available(x.device)   # None: Triton GEMMs; why: quack_backend.status()

It may run on a CUDA device of compute capability 9.0 with QuACK installed (`pip install standardkernels[cute]`;
on the offline GPU host `ci/gpu/cute.sh`) in a version written and tested against (`SUPPORTED_QUACK`, the pins
of ci/gpu/cute.lock.txt) that has the structure our subclasses and epilogues rely on (`REQUIRED`), as the engine
adapters check the engines they hook into (adapters/vllm/support.py). An installed QuACK of another version, or
one missing any of that structure, is not used: the Triton GEMMs run — the same algorithm as on every other GPU,
never a QuACK kernel half-fitted to a version it was not written for — and that choice is said once per process
(a RuntimeWarning naming the version and what is missing) and kept in `status()`. QuACK not installed is the
ordinary case: no warning, `status()` says so.

Nothing of QuACK is imported until `available` is asked about an SM90 device.

Internal, for tests: `check_installed`, `SUPPORTED_QUACK`, `REQUIRED`.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import warnings

import torch

# QuACK versions the backend was written and tested against (ci/gpu/cute.lock.txt), with the CUTLASS DSL pinned
# beside them in pyproject.toml's `cute` extra.
SUPPORTED_QUACK = ("0.6.5",)
# What `quack_gemms` takes from QuACK and the CUTLASS DSL, as (module, attribute path): missing any, it is not
# imported. Beyond these names it relies on QuACK 0.6.5's SM90 kernel body (where it reads `use_pdl`, that its
# producer warps call `cute.arch.setmaxregister_decrease`), which only the version check covers.
REQUIRED = (
    ("quack.activation", "gelu_erf"), ("quack.activation", "gelu_tanh_approx"),
    ("quack.compile_utils", "make_fake_tensor"), ("quack.cute_dsl_utils", "get_max_active_clusters"),
    ("quack.epilogue.frontend", "EpiMod._mint"), ("quack.epilogue.frontend", "unpack"),
    ("quack.epilogue.ops", "ColVecLoad.begin"), ("quack.epilogue.ops", "ColVecLoad.config_key"),
    ("quack.epilogue.ops", "EpiOp"), ("quack.epilogue.ops", "RowVecLoad"), ("quack.epilogue.ops", "Scalar"),
    ("quack.gemm_config", "GemmConfig"), ("quack.gemm_interface", "gemm_tuned.fn"),
    ("quack.sync.barrier", "release_add"),
    ("cutlass.cute", "arch.setmaxregister_decrease"), ("cutlass.cute", "arch.griddepcontrol_wait"),
    ("cutlass.cute", "arch.griddepcontrol_launch_dependents"), ("cutlass.pipeline", "NamedBarrier"),
)
GEMM_CONFIG_FIELDS = ("tile_m", "tile_n", "pingpong", "cluster_m", "cluster_n", "is_dynamic_persistent",
                      "max_swizzle_size", "device_capacity")

_decided = None  # (module or None, status line), once decided for the process


def status() -> str:
    """What `available` decided for SM90 devices in this process: "QuACK <version>: ..." where the backend runs,
    else why not; "not checked" before any SM90 call."""
    return _decided[1] if _decided is not None else "not checked (no SM90 device asked yet)"


def _missing_structure() -> list[str]:
    problems = []
    for module_name, path in REQUIRED:
        try:
            obj = importlib.import_module(module_name)
        except ImportError as e:
            problems.append(f"{module_name} ({e})")
            continue
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                problems.append(f"{module_name}.{path}")
                break
    try:
        fields = importlib.import_module("quack.gemm_config").GemmConfig.__dataclass_fields__
    except (ImportError, AttributeError):
        return problems  # already listed
    problems += [f"quack.gemm_config.GemmConfig.{f}" for f in GEMM_CONFIG_FIELDS if f not in fields]
    return problems


def check_installed():
    """(the `quack_gemms` module or None, a status line), decided afresh (`available` decides once per process
    and keeps it); warns (RuntimeWarning, naming the version and what is missing) where an installed QuACK is
    refused."""
    if importlib.util.find_spec("quack") is None:
        return None, "QuACK not installed (pip install standardkernels[cute]): Triton GEMMs"
    try:
        import quack
        version = getattr(quack, "__version__", "unknown")
    except Exception as e:  # installed but broken
        version, problems = "unknown", [f"import quack failed ({type(e).__name__}: {e})"]
    else:
        if version not in SUPPORTED_QUACK:
            problems = [f"version {version} is not one this backend was written for ({', '.join(SUPPORTED_QUACK)})"]
        else:
            problems = _missing_structure()
    if not problems:
        try:
            return importlib.import_module("sk.ops.gated_mlp.quack_gemms"), f"QuACK {version}: CuTe-DSL GEMMs"
        except Exception as e:
            problems = [f"sk.ops.gated_mlp.quack_gemms failed to load ({type(e).__name__}: {e})"]
    reason = f"QuACK {version} not used, running the Triton GEMMs: {'; '.join(problems)}"
    warnings.warn(f"sk.ops.fused_pre_norm_geglu: {reason}", RuntimeWarning, stacklevel=3)
    return None, reason


@functools.lru_cache(maxsize=16)
def available(device: torch.device):
    """The QuACK GEMM module (`quack_gemms`) where it runs on `device`, else None (see the module docstring)."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) != (9, 0):
        return None
    return _decision()[0]


def _decision():
    global _decided
    if _decided is None:
        _decided = check_installed()
    return _decided
