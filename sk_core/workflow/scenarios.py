"""Scenario files: which model runs in which engine, how, and under which workloads.

    scenarios:
      - model: sk-trained/llama     # a project model (below), or a local path / HF id
        engine: vllm
        tp: 1
        dtype: float32
        kv_cache_dtype: auto
        workloads: [LLM.mixed, LLM.single_request]

`sk capture` and `sk eval` run every row of the file they are given (vLLM rows only); `sk gate` runs vLLM and
SGLang rows. Loading validates everything a run would
otherwise trip over later (unknown workload, missing model, bad dtype, unknown keys) and names the file,
the row and the field.

The project's own models, named by token (style: llama or gemma; sk-tiny also qwen3):
  sk-trained/<style>  the trained models committed in models/trained/<style> (sk.models.trained): peaked logits,
                      so token MATCH between stock and our kernels says something; fixed sizes
  sk-tiny/<style>     random weights of any size (model_spec: sk.models.TinyModelSpec fields), written on first
                      use by sk.models.tiny_model; for shapes and speed, e.g. the GPU scenarios
`resolve_model` turns such a name into what the engine loads; `sk-serve` takes the same names.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sk.workflow.errors import WorkflowError
from sk.workflow.workloads import Workload, resolve

ENGINES = ("vllm", "sglang")
# The project's models (module docstring): trained ones it ships, random-weight ones it writes on first use.
TRAINED_PREFIX = "sk-trained/"
TINY_PREFIX = "sk-tiny/"


def check_model(model: str) -> None:
    """ValueError unless `model` names a known project model, an existing local directory, or a hub id."""
    from sk.models import STYLES, TRAINED_STYLES, trained_model

    project_models = [TRAINED_PREFIX + style for style in TRAINED_STYLES] + [TINY_PREFIX + s for s in STYLES]
    if model.startswith((TRAINED_PREFIX, TINY_PREFIX)) and model not in project_models:
        raise ValueError(f"unknown project model {model!r}; known: {', '.join(project_models)}")
    if model.startswith(TRAINED_PREFIX):
        try:
            trained_model(model[len(TRAINED_PREFIX):])
        except FileNotFoundError as e:
            raise ValueError(f"{model}: {e}") from None
    elif model.startswith((".", "/", "~")) and not Path(model).expanduser().is_dir():
        raise ValueError(f"model directory {model!r} does not exist")


def tiny_model_spec(model: str, model_spec: dict[str, Any] | None = None):
    """The sk.models.TinyModelSpec of sk-tiny model `model` with `model_spec`'s sizes (ValueError naming a bad
    field)."""
    from sk.models import TinyModelSpec

    try:
        return TinyModelSpec(style=model[len(TINY_PREFIX):], **(model_spec or {}))
    except TypeError as e:
        raise ValueError(f"model_spec: {e}") from None


def resolve_model(model: str, model_spec: dict[str, Any] | None = None) -> str:
    """What an engine loads for `model` as a scenario names it: an sk-trained model's directory, an sk-tiny
    model's directory (written on first use, sized by `model_spec`), anything else unchanged (ValueError for
    an unknown project model or a missing local directory)."""
    from sk.models import tiny_model, trained_model

    check_model(model)
    if model.startswith(TRAINED_PREFIX):
        return str(trained_model(model[len(TRAINED_PREFIX):]))
    if model.startswith(TINY_PREFIX):
        return str(tiny_model(tiny_model_spec(model, model_spec)))
    return model


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    # For sk-tiny models: TinyModelSpec fields other than style (sizes, layers, tied embeddings, seed, ...).
    model_spec: dict[str, Any] = {}
    engine: Literal["vllm", "sglang"] = "vllm"
    tp: int = Field(1, ge=1)
    dtype: Literal["float32", "bfloat16", "float16"]
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    max_model_len: int | None = Field(None, ge=16)
    # The CPU engine needs an explicit KV cache size; on a GPU leave it out (vLLM sizes it from free memory).
    kv_cache_memory_bytes: int | None = Field(None, ge=1 << 20)
    # Passed through to the engine's constructor as they are (e.g. gpu_memory_utilization).
    engine_args: dict[str, Any] = {}
    # The device's memory (GiB, e.g. 139 for an H200): with it, a row that cannot fit is refused before any
    # engine starts (check_fits).
    device_memory_gib: float | None = Field(None, gt=0)
    workloads: list[str] = Field(min_length=1)

    @field_validator("model")
    @classmethod
    def _model_exists(cls, model: str) -> str:
        check_model(model)
        return model

    @model_validator(mode="after")
    def _model_spec_fits(self) -> Scenario:
        if self.model_spec:
            if not self.model.startswith(TINY_PREFIX):
                raise ValueError(f"model_spec sizes a random-weight project model ({TINY_PREFIX}<style>), "
                                 f"not {self.model!r}")
            self.tiny_model_spec()
        return self

    @model_validator(mode="after")
    def _settings_fit_engine(self) -> Scenario:
        # SGLang sizes its KV cache by a share of free memory and names fp8 caches by their format only.
        if self.engine == "sglang" and self.kv_cache_memory_bytes is not None:
            raise ValueError("kv_cache_memory_bytes is a vLLM setting; for sglang size the KV cache with "
                             "engine_args (mem_fraction_static or max_total_tokens)")
        if self.engine == "sglang" and self.kv_cache_dtype == "fp8":
            raise ValueError("kv_cache_dtype 'fp8' is not an SGLang name; use fp8_e4m3 or fp8_e5m2")
        return self

    def tiny_model_spec(self):
        """The sk.models.TinyModelSpec of an sk-tiny model (ValueError naming a bad field)."""
        return tiny_model_spec(self.model, self.model_spec)

    def checkpoint(self) -> str:
        """What the engine loads for a model other than sk-tiny: the directory of an sk-trained model, else the
        model as written (a local path or a hub id)."""
        return self.model if self.model.startswith(TINY_PREFIX) else resolve_model(self.model)

    @field_validator("workloads")
    @classmethod
    def _known_workloads(cls, tokens: list[str]) -> list[str]:
        for token in tokens:
            try:
                resolve(token)
            except WorkflowError as e:
                raise ValueError(str(e)) from None
        return tokens

    @property
    def label(self) -> str:
        return f"{self.model} ({self.engine}, tp={self.tp})"

    @property
    def slug(self) -> str:
        """A file-name-safe name for this scenario's outputs (project models of other sizes get their spec key).

        vLLM rows keep the names of outputs written before scenarios named other engines.
        """
        model = self.tiny_model_spec().key() if self.model_spec else self.model.replace("/", "--")
        engine = "" if self.engine == "vllm" else f"-{self.engine}"
        return f"{model}{engine}-tp{self.tp}-{self.dtype}"

    def workload_members(self) -> list[Workload]:
        return [resolve(token) for token in self.workloads]


def with_workloads(loaded: list[Scenario], tokens: list[str] | None) -> list[Scenario]:
    """The rows with `tokens` (a command's --workloads) instead of their own workloads; WorkflowError for an
    unknown one."""
    if not tokens:
        return loaded
    for token in tokens:
        resolve(token)
    return [s.model_copy(update={"workloads": list(tokens)}) for s in loaded]


_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Activations, CUDA graphs, sampler and allocator workspace of one engine, beyond weights and KV cache.
ENGINE_OVERHEAD_GIB = 2.0
DEFAULT_CONTEXT = 4096  # the sk-tiny models' max_position_embeddings


def memory_need_gib(scenario: Scenario) -> dict[str, float] | None:
    """An sk-tiny row's memory per engine: weights, the KV cache of one max_model_len sequence, overhead (GiB);
    None for other models (their sizes are not known before loading)."""
    if not scenario.model.startswith(TINY_PREFIX):
        return None
    from sk.models import parameter_count

    spec = scenario.tiny_model_spec()
    dtype = _DTYPE_BYTES[scenario.dtype]
    kv_dtype = 1 if scenario.kv_cache_dtype.startswith("fp8") else dtype
    tokens = scenario.max_model_len or DEFAULT_CONTEXT
    kv = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * kv_dtype * tokens
    gib = 1 << 30
    return {"weights": parameter_count(spec) * dtype / gib / scenario.tp, "kv_one_sequence": kv / gib / scenario.tp,
            "overhead": ENGINE_OVERHEAD_GIB}


def check_fits(scenarios: list[Scenario], engines: int, path: str | Path) -> None:
    """A WorkflowError for the first row with device_memory_gib that cannot hold `engines` engines: each gets
    its share of the engine's memory fraction (vLLM gpu_memory_utilization, SGLang mem_fraction_static)."""
    for row, scenario in enumerate(scenarios):
        need = memory_need_gib(scenario)
        if scenario.device_memory_gib is None or need is None:
            continue
        key, default = (("gpu_memory_utilization", 0.9) if scenario.engine == "vllm"
                        else ("mem_fraction_static", 0.8))
        fraction = scenario.engine_args.get(key, default)
        budget = scenario.device_memory_gib * fraction / engines
        if sum(need.values()) > budget:
            parts = ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in need.items())
            raise WorkflowError(
                f"{path}: scenarios.{row} ({scenario.label}) does not fit the device: it needs "
                f"{sum(need.values()):.1f} GiB per engine ({parts}), and {engines} engine(s) on "
                f"{scenario.device_memory_gib:g} GiB at {key} {fraction:g} get {budget:.1f} GiB each; use a "
                f"smaller model_spec or max_model_len, a larger {key}, or tp > 1")


class ScenarioFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scenarios: list[Scenario] = Field(min_length=1)


def load(path: str | Path, engines: tuple[str, ...] = ENGINES) -> list[Scenario]:
    """The scenarios of a YAML file, or a WorkflowError naming the file and what is wrong where.

    `engines`: those the calling command runs; a row for another engine is refused.
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WorkflowError(f"scenario file {path} does not exist") from None
    except IsADirectoryError:
        raise WorkflowError(f"scenario file {path} is a folder; expected a YAML file (e.g. scenarios/tiny.yaml)"
                            ) from None
    except UnicodeDecodeError as e:
        raise WorkflowError(f"scenario file {path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                            f"{e.start}); expected a YAML file") from None
    except OSError as e:
        raise WorkflowError(f"scenario file {path} cannot be read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise WorkflowError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        kind = {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(data), "value")
        found = "an empty file" if data is None else f"a YAML {kind}"
        raise WorkflowError(f"{path} is not a scenario file: found {found}; expected a mapping with a "
                            "'scenarios:' list at the top level (e.g. scenarios/tiny.yaml)")
    try:
        loaded = ScenarioFile.model_validate(data).scenarios
    except ValidationError as e:
        problems = []
        for error in e.errors():
            where = ".".join(str(p) for p in error["loc"]) or "top level"
            problems.append(f"  {where}: {error['msg']}")
        raise WorkflowError(f"{path} is not a valid scenario file:\n" + "\n".join(problems)) from None
    for row, scenario in enumerate(loaded):
        if scenario.engine not in engines:
            raise WorkflowError(f"{path}: scenarios.{row}.engine is {scenario.engine!r}; this command runs "
                                f"{' and '.join(engines)} only")
    return loaded
