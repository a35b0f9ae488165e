"""Any architecture the installed vLLM serves: its replaceable operators, found in vLLM's own model class.

`sk list --map ARCH`, `sk create-stubs --architecture ARCH` and the capture map call `architecture_operators`.
ARCH is a Hugging Face model_type (`qwen3`, `gemma2`) or an architecture class name (`Qwen3ForCausalLM`). The
architecture's HF config class gives a tiny config (two heads, one layer); vLLM's model registry gives the
model class for it, which is built on the meta device (no weights, no memory) inside a one-process vLLM
config, and walked: every layer built through vLLM's replaceable-op registry (CustomOp / PluggableLayer) is an
operator, named as vLLM registers it (what `sk capture` records), with its class and our coverage
(sk.workflow.operators). Attention layers are listed too, as not covered. The walk runs in a child process:
vLLM's distributed state and config stay out of the calling process.
"""
from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from sk.workflow.errors import WorkflowError

# Sizes of the model built for the walk: the layer classes do not depend on them.
TINY_CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
               "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 256}
WALK_TIMEOUT_S = 300


def _module_source(module: str) -> ast.Module:
    # Found from the top-level package: find_spec of a submodule would import its parents.
    package, *rest = module.split(".")
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ImportError(f"no module named {package!r}")
    return ast.parse(Path(spec.origin).parent.joinpath(*rest[:-1], rest[-1] + ".py").read_text(encoding="utf-8"))


def _string_keys(node: ast.AST) -> list:
    if isinstance(node, ast.Dict):
        return [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    return []


@functools.lru_cache(maxsize=None)
def causal_lm_architectures() -> dict[str, str]:
    """HF model_type -> its causal-LM class name, for the text-only form where a model has one (gemma3 ->
    gemma3_text's Gemma3ForCausalLM), restricted to what the installed vLLM registers.

    Read from the installed packages' source (transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, vLLM's registry
    tables) without importing them: a name is resolved, or refused, in milliseconds and with no side effect.
    """
    registered = set()
    for node in _module_source("vllm.model_executor.models.registry").body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id.endswith("_MODELS") for t in targets):
                registered.update(_string_keys(node.value))
    causal: dict[str, str] = {}
    for node in _module_source("transformers.models.auto.modeling_auto").body:
        if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"
                                                 for t in node.targets)):
            causal = dict(ast.literal_eval(node.value.args[0]))  # OrderedDict([(model_type, class name), ...])
    found = {}
    for model_type, cls in causal.items():
        text = causal.get(f"{model_type}_text")
        for candidate in (text, cls) if text else (cls,):
            if candidate in registered:
                found[model_type] = candidate
                break
    return found


def resolve_architecture(name: str) -> tuple[str, str]:
    """(model_type, class name) for `name`, or a WorkflowError naming close matches among vLLM's."""
    known = causal_lm_architectures()
    by_class = {cls: model_type for model_type, cls in known.items()}
    if name in known:
        return name, known[name]
    if name in by_class:
        return by_class[name], name
    lowered = {k.lower(): k for k in [*known, *by_class]}
    if name.lower() in lowered:
        return resolve_architecture(lowered[name.lower()])
    close = difflib.get_close_matches(name.lower(), list(lowered), n=6, cutoff=0.6)
    hint = f"close matches: {', '.join(lowered[c] for c in close)}" if close else \
        f"known: {len(known)} model types, e.g. {', '.join(sorted(known)[:8])}"
    raise WorkflowError(f"unknown architecture {name!r}: the installed vLLM registers no causal LM of that name; "
                        f"{hint}")


def _walk(architectures: list[tuple[str, str]]) -> dict[str, list[dict]]:
    """In a process of its own (the child below): the replaceable layers of each (model_type, class) vLLM model."""
    import tempfile

    import torch
    from transformers import CONFIG_MAPPING
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor import custom_op
    from vllm.model_executor.models import ModelRegistry

    replaceable = tuple(getattr(custom_op, n) for n in ("CustomOp", "PluggableLayer") if hasattr(custom_op, n))
    walked = {}
    with tempfile.TemporaryDirectory(prefix="sk-map-") as root:
        for i, (model_type, cls_name) in enumerate(architectures):
            config_type = f"{model_type}_text" if f"{model_type}_text" in CONFIG_MAPPING else model_type
            folder = f"{root}/{i}"
            CONFIG_MAPPING[config_type](**TINY_CONFIG, architectures=[cls_name]).save_pretrained(folder)
            model_config = ModelConfig(model=folder, skip_tokenizer_init=True, dtype="float32")
            vllm_config = VllmConfig(model_config=model_config)
            with set_current_vllm_config(vllm_config):
                if i == 0:  # one process, one rank: the parallel groups every vLLM layer asks for
                    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                                 distributed_init_method=f"file://{root}/dist")
                    initialize_model_parallel(1, 1)
                model_cls, _ = ModelRegistry.resolve_model_cls([cls_name], model_config)
                with torch.device("meta"):
                    model = model_cls(vllm_config=vllm_config, prefix="")
            layers: dict[str, dict] = {}
            for _, module in model.named_modules():
                cls = type(module)
                op = getattr(cls, "name", None) if isinstance(module, replaceable) else None
                if op is None and cls.__name__ == "Attention" and cls.__module__.startswith("vllm.model_executor"):
                    op = "attention"
                if op:
                    layers.setdefault(f"{op}:{cls.__name__}",
                                      {"op": op, "class": cls.__name__, "module": cls.__module__})
            walked[model_type] = list(layers.values())
    return walked


def walk_architectures(names: list[str]) -> dict[str, tuple[str, list[dict]]]:
    """model_type -> (class name, each distinct {"op", "class", "module"} of vLLM's model) for every name, in one
    child process; a WorkflowError for a name vLLM does not register or a model vLLM cannot build."""
    try:
        resolved = [resolve_architecture(name) for name in names]
    except ImportError as e:
        raise WorkflowError(f"the operator map reads the installed vLLM's model registry, and vLLM cannot be "
                            f"imported here ({e})") from None
    done = subprocess.run([sys.executable, "-m", "sk.workflow.engine_map", json.dumps(resolved)],
                          capture_output=True, text=True, timeout=WALK_TIMEOUT_S)
    if done.returncode:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit code {done.returncode}"
        raise WorkflowError(f"vLLM could not build {', '.join(c for _, c in resolved)} on the meta device to list "
                            f"the operators: {last}")
    walked = json.loads(done.stdout.strip().splitlines()[-1])
    for model_type, cls_name in resolved:
        _walked[model_type] = (cls_name, walked[model_type])
    return {model_type: _walked[model_type] for model_type, _ in resolved}


# model_type -> (class name, layers): walked once per process.
_walked: dict[str, tuple[str, list[dict]]] = {}


def architecture_layers(name: str) -> tuple[str, str, tuple[dict, ...]]:
    """(model_type, class name, its layers) for one architecture (walk_architectures)."""
    model_type, _ = resolve_architecture(name)
    if model_type not in _walked:
        walk_architectures([name])
    cls_name, layers = _walked[model_type]
    return model_type, cls_name, tuple(layers)


if __name__ == "__main__":
    print(json.dumps(_walk([tuple(pair) for pair in json.loads(sys.argv[1])])))
