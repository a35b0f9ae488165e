"""Every environment variable the package honours, read here and nowhere else.

    sk.settings.get("geglu_cute")                 # the value in force (an override, else the environment)
    with sk.settings.override(geglu_cute=False):  # this thread / async task only, for a block of code
        ...
    sk.settings.markdown_table()                  # the README's table (tests/test_settings.py keeps them equal)

Switches are read from the environment once, at first use, and kept; `reload()` reads them again (after a
test or a launcher changed `os.environ`). The variables that carry state to engine processes started later
(`live` below: which adapters are on, where reports go, caches) are read on every use, because this package
and its callers set them at run time for the children they start.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping


def _flag(raw: str) -> bool:
    return raw == "1"


def _choice(env: str, *options: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in options:
            raise ValueError(f"{env}={raw!r}: expected one of {', '.join(options)}")
        return value
    return parse


def _path(raw: str) -> Path:
    return Path(raw).expanduser()


@dataclasses.dataclass(frozen=True)
class Setting:
    env: str
    default: str
    parse: Callable[[str], Any]
    effect: str
    live: bool = False  # read on every use: set at run time for child processes


SETTINGS: dict[str, Setting] = {
    "strict": Setting(
        "SK_STRICT", "0", _flag,
        "`1`: every fallback to a PyTorch reference raises `sk.CoverageError` (the default of "
        "`sk.coverage.strict()`, in this process and the engine processes it starts; `sk-serve --strict`)."),
    "adapters": Setting(
        "SK_ADAPTERS", "", lambda raw: tuple(n.strip() for n in raw.split(",") if n.strip()),
        "Comma-separated engines (`vllm`, `sglang`) whose adapter the engines' plugin entry points switch on in "
        "every process; set by `sk.adapters.vllm.activate()`, `import sk.adapters.sglang` and `sk-serve`.",
        live=True),
    "report_dir": Setting(
        "SK_REPORT_DIR", "", lambda raw: _path(raw) if raw else None,
        "Folder where each process with an adapter on writes its JSON report (replaced layers, kernel calls, "
        "fallbacks); `sk-serve` sets it.", live=True),
    "cache_dir": Setting(
        "SK_CACHE_DIR", "~/.cache/standardkernels", _path,
        "Where the CI scripts keep the pinned engine venvs and `sk-tiny/*` models are written on first use.",
        live=True),
    "candidate_dir": Setting(
        "SK_CANDIDATE_DIR", "candidates", _path,
        "The candidate-kernel folder of `sk bench`, `sk eval` and `sk create-stubs` (`--candidates` overrides).",
        live=True),
    "capture": Setting(
        "SK_CAPTURE", "0", _flag,
        "`1`: SGLang's scheduler processes record their layers' constructor arguments and input shapes "
        "(`sk.workflow.sglang_capture`, through our SGLang plugin entry point); set by `sk capture` for "
        "`engine: sglang` rows.", live=True),
    "geglu_fold_ln": Setting(
        "SK_GEGLU_FOLD_LN", "1", _flag,
        "`0`: inference of `fused_pre_norm_geglu` normalizes x in the gate/up kernel instead of using cached "
        "gate/up weights with the LayerNorm scale folded in."),
    "geglu_pdl": Setting(
        "SK_GEGLU_PDL", "1", _flag,
        "`0`: the GEGLU op's kernels launch in plain stream order instead of as programmatic dependent launches "
        "(Hopper). Off under the Triton interpreter."),
    "geglu_cute": Setting(
        "SK_GEGLU_CUTE", "1", _flag,
        "`0`: the GEGLU op keeps its Triton GEMMs where QuACK's CuTe-DSL GEMMs would run (SM90 with QuACK "
        "installed). Off under the Triton interpreter."),
    "geglu_train_gemms": Setting(
        "SK_GEGLU_TRAIN_GEMMS", "auto", _choice("SK_GEGLU_TRAIN_GEMMS", "auto", "triton", "cublas"),
        "Which GEMMs the training forward of `fused_pre_norm_geglu` runs: `triton` (the fused kernels), `cublas` "
        "(our LayerNorm and GEGLU kernels around cuBLAS products), `auto` (cuBLAS above the step-graph range, "
        "m·d_model·d_ff > 2³²: results/h200/geglu/README.md)."),
    "gated_mlp_pdl": Setting(
        "SK_GATED_MLP_PDL", "1", _flag,
        "`0`: the kernels of `fused_gated_mlp` launch in plain stream order instead of as programmatic dependent "
        "launches (Hopper) where their config asks for them. Off under the Triton interpreter."),
    "norm_pdl": Setting(
        "SK_NORM_PDL", "1", _flag,
        "`0`: the forward kernels of `sk.ops`' RMSNorm family (plain, Gemma, fused with the residual add) launch in "
        "plain stream order instead of as programmatic dependent launches, as SGLang's own norm kernels do on "
        "NVIDIA GPUs from Hopper (SM90) on. Off before SM90 and under the Triton interpreter."),
    "kernels": Setting(
        "SK_KERNELS", "1", _flag,
        "`0`: every op runs its PyTorch reference instead of its kernels, each call recorded as a fallback with "
        "that reason (an error under strict mode), while the adapters' custom ops and swapped layers stay: the "
        "A/B switch that tells our kernels' effect from the rest of an integration. The fused decoder blocks, "
        "which the adapters plan from kernel coverage, then stay the engine's."),
    "fused_mlp": Setting(
        "SK_FUSED_MLP", "1", _flag,
        "`1`: the engine adapters make each decoder layer's post-attention norm + MLP one `fused_gated_mlp` call "
        "(on a GPU, where the op has a kernel for the layer's dtype and shape); `0`: the engine's own layers run "
        "them, with our norm and activation ops (the A/B switch). Read by every engine process.",
        live=True),
    "norm_act_layers": Setting(
        "SK_NORM_ACT_LAYERS", "1", _flag,
        "`1`: the engine adapters run the engines' RMSNorm, GemmaRMSNorm, SiluAndMul and GeluAndMul layers on our "
        "ops (in vLLM: the `vllm.ir` provider \"sk\" first, and out-of-tree layer classes); `0`: those layers stay "
        "the engine's (in vLLM, compiled by Inductor), and only the fused decoder blocks (SK_FUSED_MLP) and the "
        "projections (SK_ATTENTION_LINEAR) are ours: the A/B switch for what the standalone layers cost or gain "
        "inside an engine's graphs. Read by every engine process.",
        live=True),
    "attention_linear": Setting(
        "SK_ATTENTION_LINEAR", "0", _flag,
        "`1`: the engine adapters run each decoder layer's QKV and output projections through `sk.ops.linear` with "
        "`backend=\"auto\"`: our split-K kernel where its tuned table measured it faster than cuBLAS (Llama-3-8B's "
        "projections at 1–8 rows, 1.01–1.12× on an H100), cuBLAS elsewhere. Off by default until the engines' "
        "paired runs show the gain. Read by every engine process.",
        live=True),
    "step_graphs": Setting(
        "SK_STEP_GRAPHS", "1", _flag,
        "`0`: eager training steps of `fused_pre_norm_geglu` launch from Python every time instead of being "
        "replayed from CUDA graphs after two calls."),
    "triton_interpret": Setting(
        "TRITON_INTERPRET", "0", _flag,
        "Triton's own switch, read by Triton at import. `1`: the kernels run on CPU tensors through Triton's "
        "interpreter (how CI tests them without a GPU); the GEGLU op's PDL and CuTe paths are off, and the GEMM "
        "ops (GEGLU, `fused_gated_mlp`, `linear`) run their PyTorch reference in bf16, recorded (the interpreter's "
        "bf16 `tl.dot` is wrong)."),
}

_environment: dict[str, Any] = {}
_overrides: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "sk_settings_overrides", default=MappingProxyType({}))


def _setting(name: str) -> Setting:
    try:
        return SETTINGS[name]
    except KeyError:
        raise KeyError(f"unknown setting {name!r}; known: {', '.join(SETTINGS)}") from None


def from_environment(name: str) -> Any:
    """The value the environment gives `name` (its default when unset), ignoring overrides."""
    s = _setting(name)
    if s.live or name not in _environment:
        value = s.parse(os.environ.get(s.env, s.default))
        if s.live:
            return value
        _environment[name] = value
    return _environment[name]


def get(name: str) -> Any:
    """The value of setting `name` in force here: the innermost `override`, else the environment."""
    overrides = _overrides.get()
    if name in overrides:
        return overrides[name]
    return from_environment(name)


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Within this block (this thread / async task only), settings take these values; the environment is untouched.

    Child processes are not affected: pass them an environment (`Setting.env`) instead.
    """
    for name in values:
        _setting(name)
    token = _overrides.set(MappingProxyType({**_overrides.get(), **values}))
    try:
        yield
    finally:
        _overrides.reset(token)


def reload() -> None:
    """Read the switches from the environment again at their next use."""
    _environment.clear()


# What switches our adapter on in an engine process: removed from a stock run's environment.
ENGINE_SWITCHES = ("adapters", "strict", "report_dir")
# What changes the model an engine compiles (which layers call which of our ops): an engine's compile cache must
# be keyed by their values, or a start with other values loads a graph compiled for these.
ENGINE_GRAPH_SETTINGS = ("fused_mlp", "attention_linear", "norm_act_layers")


def env_name(name: str) -> str:
    """The environment variable of setting `name`, for building a child process's environment."""
    return _setting(name).env


def stock_environment(environ: Mapping[str, str] | None = None, also: tuple[str, ...] = ()) -> dict[str, str]:
    """`environ` (default: this process's) without the engine switches and the settings named in `also`."""
    drop = {env_name(n) for n in (*ENGINE_SWITCHES, *also)}
    return {k: v for k, v in (os.environ if environ is None else environ).items() if k not in drop}


def markdown_table() -> str:
    """The README's settings table: variable, default, effect."""
    lines = ["| Variable | Default | Effect |", "|---|---|---|"]
    for s in SETTINGS.values():
        default = f"`{s.default}`" if s.default else "unset"
        lines.append(f"| `{s.env}` | {default} | {s.effect} |")
    return "\n".join(lines)
