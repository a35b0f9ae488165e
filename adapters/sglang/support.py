"""Which SGLang the adapter knows, and a check that the installed one has the structure the hooks rely on.

The hooks reach into SGLang internals (the HookRegistry, the MultiPlatformOp forwards of four layer classes, their
attributes, Scheduler.get_internal_state), so an unknown version or layout is refused with a message that names
it rather than half-patched.
"""
from __future__ import annotations

import importlib
import inspect

# sglang.__version__ -> description: what was read and tested (see NOTES.md).
SUPPORTED = {"0.5.17": "SGLang 0.5.17"}

NORM_FORWARD_PARAMS = ["self", "x", "residual", "post_residual_addition"]
ACT_FORWARD_PARAMS = ["self", "x"]
# module -> class -> (parameters of its forward_cuda and forward_native, constructor parameters the hooks read).
LAYERS = {
    "sglang.srt.layers.layernorm": {
        "RMSNorm": (NORM_FORWARD_PARAMS, ["hidden_size", "eps", "var_hidden_size", "cast_x_before_out_mul",
                                          "fp32_residual", "has_weight", "weight_dtype", "override_orig_dtype"]),
        "GemmaRMSNorm": (NORM_FORWARD_PARAMS, ["hidden_size", "eps"]),
    },
    "sglang.srt.layers.activation": {
        "SiluAndMul": (ACT_FORWARD_PARAMS, []),
        "GeluAndMul": (ACT_FORWARD_PARAMS, ["approximate"]),
    },
}
FORWARDS = ("forward_cuda", "forward_native")


class UnsupportedSglangError(RuntimeError):
    pass


def check_installed_sglang() -> str:
    """The supported build's description, or UnsupportedSglangError naming the version and what is missing."""
    import sglang

    version = sglang.__version__
    if version not in SUPPORTED:
        raise UnsupportedSglangError(
            f"standardkernels' SGLang adapter does not know SGLang {version} (it supports: "
            f"{', '.join(SUPPORTED.values())}). Do not import sk.adapters.sglang (or unset SK_ADAPTERS, or run "
            f"sk-serve --no-sk) to use stock SGLang."
        )
    problems = []
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        if not (hasattr(HookRegistry, "register") and hasattr(HookRegistry, "apply_hooks")
                and hasattr(HookType, "AROUND") and hasattr(HookType, "AFTER")):
            problems.append("sglang.srt.plugins.hook_registry lacks HookRegistry.register/apply_hooks or AROUND/AFTER")
    except ImportError as e:
        problems.append(f"no sglang.srt.plugins.hook_registry ({e})")
    from sglang.srt.layers.utils import MultiPlatformOp

    for module_name, classes in LAYERS.items():
        module = importlib.import_module(module_name)
        for cls_name, (forward_params, init_params) in classes.items():
            cls = getattr(module, cls_name, None)
            if not (isinstance(cls, type) and issubclass(cls, MultiPlatformOp)):
                problems.append(f"{module_name}.{cls_name} is missing or not a MultiPlatformOp")
                continue
            for name in FORWARDS:
                method = cls.__dict__.get(name)
                if method is None or list(inspect.signature(method).parameters) != forward_params:
                    problems.append(f"{cls_name}.{name} is not defined as ({', '.join(forward_params)})")
            missing = set(init_params) - set(inspect.signature(cls.__init__).parameters)
            if missing:
                problems.append(f"{cls_name}.__init__ lacks {', '.join(sorted(missing))}")
    from sglang.srt.managers.scheduler import Scheduler

    if "get_internal_state" not in Scheduler.__dict__:
        problems.append("sglang.srt.managers.scheduler.Scheduler has no get_internal_state")
    if problems:
        raise UnsupportedSglangError(
            f"SGLang {version} does not have the structure standardkernels' adapter was written for: "
            + "; ".join(problems)
        )
    return SUPPORTED[version]
