"""The PR description quotes the results files `RESULT_FILES` names, in its order, and nothing else under results/."""
import sysconfig
from pathlib import Path

import pytest

from sk.export import main
from sk.export.kernel_module import ALL_OPS
from sk.export.pr_description import RESULT_FILES, render
from sk.export.series import ENGINES

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_named_results_file_is_committed(engine):
    assert RESULT_FILES[engine], f"{engine} quotes no results"
    missing = [name for name in RESULT_FILES[engine] if not (REPO / "results" / name).is_file()]
    assert not missing, f"RESULT_FILES names files that results/ does not have: {missing}"


def _render(engine: str, results: Path) -> str:
    return render(engine, "target", ALL_OPS, "SWITCH", results, ["0001-x.patch"])


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_only_named_files_are_quoted_in_their_order(engine, tmp_path):
    results = tmp_path / "results"
    for number, name in enumerate(RESULT_FILES[engine]):
        (results / name).parent.mkdir(parents=True, exist_ok=True)
        (results / name).write_text(f"table {number}\n")
    # A note that names every op and sits under the engine's folder: the old glob would have quoted it.
    (results / "h200" / "engines" / f"{engine}_note.md").write_text(" ".join(ALL_OPS) + "\n")
    text = _render(engine, results)
    assert "_note.md" not in text
    quoted = [f"From `results/{name}`:\n\ntable {number}" for number, name in enumerate(RESULT_FILES[engine])]
    positions = [text.index(q) for q in quoted]
    assert positions == sorted(positions)


def test_quoted_relative_links_are_made_repository_paths(tmp_path):
    # A results README links its neighbours relative to itself; quoted in the description, they name the file
    # from Standard Kernels' root instead (here a results folder named "quoted"). Absolute and in-page links stay.
    results = tmp_path / "quoted"
    for name in RESULT_FILES["vllm"]:
        (results / name).parent.mkdir(parents=True, exist_ok=True)
        (results / name).write_text("x\n")
    (results / RESULT_FILES["vllm"][0]).write_text(
        "see [`../../h100/engines/`](../../h100/engines/README.md), [runs](2026-12-05/a.md), "
        "[docs](https://example.org/x), [below](#files)\n")
    text = _render("vllm", results)
    assert ("see [`../../h100/engines/`](quoted/h100/engines/README.md), [runs](quoted/h200/engines/2026-12-05/a.md), "
            "[docs](https://example.org/x), [below](#files)") in text


def test_a_missing_named_file_stops_the_export(tmp_path, capsys):
    purelib = sysconfig.get_paths()["purelib"]
    if not (Path(purelib) / "vllm").is_dir():
        pytest.skip("vllm is not installed here")
    empty = tmp_path / "results"
    empty.mkdir()
    args = ["--engine", "vllm", "--source", purelib, "--results", str(empty), "--out", str(tmp_path / "out")]
    assert main(args) == 2
    assert f"refused: {empty / RESULT_FILES['vllm'][0]} is missing" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
