"""Bad input to every `sk` subcommand: one message naming what is wrong and what is supported, exit code 2, no
traceback, within a fraction of the 27-55 s an engine takes to start, and nothing written (no output folder, no
temporary folder, no candidate folder)."""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from sk.cli import main

REPO = Path(__file__).resolve().parents[2]
GOOD_SCENARIO = str(REPO / "scenarios" / "tiny.yaml")
# In process, with the interpreter's modules already imported: argparse and file checks take milliseconds.
IN_PROCESS_LIMIT_S = 3.0

SCENARIO_ROW = "scenarios:\n  - model: sk-tiny/llama\n    dtype: float32\n    workloads: [LLM.mixed]\n"


def write_inputs(root: Path) -> None:
    """The bad inputs the cases name, in `root/in/` (everything else under root must stay as it is)."""
    bad = root / "in"
    bad.mkdir()
    (bad / "folder.yaml").mkdir()
    (bad / "latin1.yaml").write_bytes("scenarios:\n  - model: caf\xe9\n".encode("latin-1"))
    (bad / "broken.yaml").write_text("scenarios: [\n")
    (bad / "empty.yaml").write_text("")
    (bad / "list.yaml").write_text("- model: sk-tiny/llama\n")
    (bad / "scalar.yaml").write_text("just some text\n")
    (bad / "rows_not_a_list.yaml").write_text("scenarios: 3\n")
    (bad / "misspelled.yaml").write_text(SCENARIO_ROW.replace("scenarios:", "scenario:"))
    (bad / "engine_false.yaml").write_text(SCENARIO_ROW + "    engine_args: {enable_prefix_caching: false}\n")
    (bad / "a_file").write_text("not a folder\n")
    (bad / "eval.json").write_text('{"schema": "standardkernels.eval/4", "scenarios": []}\n')
    (bad / "not_a_wheel.whl").write_text("not a zip\n")
    (bad / "captures_latin1").mkdir()
    (bad / "captures_latin1" / "tiny.mixed.json").write_bytes(b'{"schema": "caf\xe9"}')
    (bad / "captures_truncated").mkdir()
    (bad / "captures_truncated" / "tiny.mixed.json").write_text('{"schema": "standardkernels.capture/1", "oper')


SCENARIO_FILES = [  # (file under in/, what the message says)
    ("missing.yaml", "scenario file {in}/missing.yaml does not exist"),
    ("folder.yaml", "scenario file {in}/folder.yaml is a folder; expected a YAML file"),
    ("latin1.yaml", "scenario file {in}/latin1.yaml is not UTF-8 text (byte 0xe9 at offset 25)"),
    ("broken.yaml", "{in}/broken.yaml is not valid YAML"),
    ("empty.yaml", "{in}/empty.yaml is not a scenario file: found an empty file; expected a mapping with a "
                   "'scenarios:' list"),
    ("list.yaml", "found a YAML list; expected a mapping"),
    ("scalar.yaml", "found a YAML string; expected a mapping"),
    ("rows_not_a_list.yaml", "scenarios: Input should be a valid list"),
    ("misspelled.yaml", "scenario: Extra inputs are not permitted"),
]

NOT_ALLOWED = "is not allowed: expected a whole number, 1 or more"
CASES = [  # (argv, what the message says); {in}: the bad inputs, {out}: a folder that must not appear
    *[([command, f"{{in}}/{name}", "--out", "{out}"], message)
      for command in ("eval", "capture", "gate") for name, message in SCENARIO_FILES],
    (["gate", "{in}/folder.yaml"], "is a folder"),  # no --out: not even a temporary folder
    (["gate", "{in}/engine_false.yaml", "--via-server"], "engine_args.enable_prefix_caching: false has no "
                                                         "command-line form"),
    (["eval", GOOD_SCENARIO, "--max-layers", "-3", "--out", "{out}"], f"argument --max-layers: -3 {NOT_ALLOWED}"),
    (["eval", GOOD_SCENARIO, "--max-layers", "0", "--out", "{out}"], f"argument --max-layers: 0 {NOT_ALLOWED}"),
    (["eval", GOOD_SCENARIO, "--max-requests", "0", "--out", "{out}"], f"argument --max-requests: 0 {NOT_ALLOWED}"),
    (["eval", GOOD_SCENARIO, "--max-layers", "two", "--out", "{out}"],
     "argument --max-layers: 'two' is not a whole number; expected 1 or more"),
    (["eval", GOOD_SCENARIO, "--tie-nats", "-0.1", "--out", "{out}"],
     "argument --tie-nats: -0.1 is not allowed: expected a finite number, 0 or more"),
    (["eval", GOOD_SCENARIO, "--tie-nats", "inf", "--out", "{out}"],
     "argument --tie-nats: inf is not allowed: expected a finite number, 0 or more"),
    (["eval", GOOD_SCENARIO, "--tie-nats", "small", "--out", "{out}"],
     "argument --tie-nats: 'small' is not a number; expected 0 or more"),
    (["capture", GOOD_SCENARIO, "--max-layers", "0", "--out", "{out}"], f"argument --max-layers: 0 {NOT_ALLOWED}"),
    (["capture", GOOD_SCENARIO, "--max-requests", "-1", "--out", "{out}"],
     f"argument --max-requests: -1 {NOT_ALLOWED}"),
    (["gate", GOOD_SCENARIO, "--limit", "-1"], f"argument --limit: -1 {NOT_ALLOWED}"),
    (["gate", GOOD_SCENARIO, "--limit", "0", "--out", "{out}"], f"argument --limit: 0 {NOT_ALLOWED}"),
    (["gate", GOOD_SCENARIO, "--limit", "1.5"], "argument --limit: '1.5' is not a whole number; expected 1 or more"),
    (["gate", GOOD_SCENARIO, "--candidate-env", "TRITON_INTERPRET"],
     "argument --candidate-env: 'TRITON_INTERPRET' is not KEY=VALUE"),
    (["gate", GOOD_SCENARIO, "--candidate-env", "=1"], "argument --candidate-env: '=1' is not KEY=VALUE"),
    (["bench", "--target", "rms_norm", "--self-test", "--max-shapes", "0"], f"argument --max-shapes: 0 {NOT_ALLOWED}"),
    (["bench", "--target", "rms_norm", "--self-test", "--max-shapes", "-2"],
     f"argument --max-shapes: -2 {NOT_ALLOWED}"),
    (["bench", "--target", "rms_norm", "--self-test", "--captures", "{in}/captures_latin1"],
     "{in}/captures_latin1/tiny.mixed.json in the capture folder is not a readable JSON file (UnicodeDecodeError"),
    (["bench", "--target", "rms_norm", "--self-test", "--captures", "{in}/captures_truncated"],
     "{in}/captures_truncated/tiny.mixed.json in the capture folder is not a readable JSON file (JSONDecodeError"),
    (["list", "--map", "llama", "--captures", "{in}/captures_truncated"], "is not a readable JSON file"),
    # The known names come from the installed vLLM's registry (tests/workflow/test_engine_map.py lists them).
    (["create-stubs", "--architecture", "nonsense", "--candidates", "{out}"], "unknown architecture 'nonsense'"),
    (["list", "--map", "qwen33"], "unknown architecture 'qwen33'"),
    (["eval", GOOD_SCENARIO, "--self-test", "--candidates", "{in}", "--out", "{out}"],
     "--self-test runs the stock engine against itself and takes no candidate folder; got --candidates {in}"),
    (["eval", GOOD_SCENARIO, "--rounds", "0", "--out", "{out}"], f"argument --rounds: 0 {NOT_ALLOWED}"),
    (["eval", GOOD_SCENARIO, "--crossed", "--rounds", "6", "--out", "{out}"],
     "--rounds must be a multiple of 4, 2 or more for each of the 2 engine pairs (as many A B rounds as B A "
     "rounds); got --rounds 6"),
    (["eval", GOOD_SCENARIO, "--rounds", "3", "--out", "{out}"],
     "--rounds must be a multiple of 2, 2 or more for the engine pair (as many A B rounds as B A rounds); got "
     "--rounds 3"),
    (["eval", GOOD_SCENARIO, "--restarts", "3", "--rounds", "6", "--out", "{out}"],
     "--restarts must be 1 or even: the engine pairs alternate their start order, and only an even number starts "
     "each engine first as often; got --restarts 3"),
    (["eval", GOOD_SCENARIO, "--restarts", "0", "--out", "{out}"], f"argument --restarts: 0 {NOT_ALLOWED}"),
    (["eval", GOOD_SCENARIO, "--crossed", "--restarts", "4", "--out", "{out}"],
     "--crossed is --restarts 2; got --restarts 4 too (drop one of the two)"),
    (["profile", GOOD_SCENARIO, "--workloads", "LLM.nope", "--out", "{out}"], "unknown workload 'LLM.nope'"),
    (["profile"], "sk profile needs a scenario YAML (or --compare BASE.json CANDIDATE.json)"),
    (["profile", GOOD_SCENARIO, "--both", "--sk", "--out", "{out}"],
     "sk profile --both profiles stock and then ours: drop --sk"),
    (["profile", GOOD_SCENARIO, "--side-by-side", "--out", "{out}"],
     "sk profile --side-by-side starts the stock engine and ours together: add --both"),
    (["profile", GOOD_SCENARIO, "--compare", "{in}/empty.yaml", "{in}/empty.yaml"],
     "sk profile --compare reads two profiles and runs nothing: drop the scenario"),
    (["profile", "--compare", "{in}/a_file", "{in}/a_file"], "sk profile --compare: cannot read {in}/a_file as JSON"),
    (["profile", "--compare", "{in}/eval.json", "{in}/a_file"],
     "is not an `sk profile` file (schema standardkernels.profile/1)"),
    # An output folder that is a file (or lies under one) is refused before the work, not by mkdir after it.
    (["eval", GOOD_SCENARIO, "--out", "{in}/a_file"], "argument --out: {in}/a_file: it is a file, not a folder"),
    (["capture", GOOD_SCENARIO, "--out", "{in}/a_file/captures"],
     "argument --out: {in}/a_file/captures: {in}/a_file is a file, not a folder"),
    (["gate", GOOD_SCENARIO, "--out", "{in}/a_file"], "argument --out: {in}/a_file: it is a file, not a folder"),
    (["create-stubs", "--architecture", "llama", "--candidates", "{in}/a_file"],
     "argument --candidates: {in}/a_file: it is a file, not a folder"),
    (["bench", "--peers", "--out", "{in}/a_file"], "argument --out: {in}/a_file: it is a file, not a folder"),
    (["export", "--engine", "vllm", "--source", "{in}/a_file", "--out", "{in}/a_file"],
     "argument --out: {in}/a_file: it is a file, not a folder"),
    (["export", "--engine", "vllm", "--source", "{in}/a_file", "--results", "{in}/no_results"],
     "argument --results: {in}/no_results does not exist; expected an existing folder"),
    (["export", "--engine", "vllm", "--source", "{in}/not_a_wheel.whl", "--out", "{out}"],
     "--source {in}/not_a_wheel.whl is not a readable wheel"),
    (["export", "--engine", "vllm", "--source", "{in}/missing", "--out", "{out}"],
     "--source {in}/missing does not exist"),
]


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """tmp_path with the bad inputs, as the working directory (default output folders land here) and as the
    temporary-file directory (sk gate's default output folder)."""
    write_inputs(tmp_path)
    (tmp_path / "tmp").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path


def fill(argv: list[str], root: Path) -> list[str]:
    return [a.format(**{"in": root / "in", "out": root / "out"}) for a in argv]


def no_child_process(*args, **kwargs):
    raise AssertionError(f"a child process (engine, lm-eval, server) was started: {args}")


@pytest.mark.parametrize("argv, message", CASES, ids=[" ".join(argv).replace(GOOD_SCENARIO, "tiny.yaml")
                                                      for argv, _ in CASES])
def test_bad_input_is_refused_at_once_with_one_message(workspace, argv, message, capsys, monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", no_child_process)
    before = tree(workspace)
    start = time.monotonic()
    try:
        code = main(fill(argv, workspace))
    except SystemExit as e:  # argparse's refusal
        code = e.code
    elapsed = time.monotonic() - start
    captured = capsys.readouterr()
    output = " ".join((captured.out + captured.err).split())  # rich and argparse wrap long lines
    assert code == 2, output
    assert " ".join(message.format(**{"in": workspace / "in"}).split()) in output
    assert "Traceback" not in output
    assert tree(workspace) == before, "the refused command wrote something"
    assert elapsed < IN_PROCESS_LIMIT_S


@pytest.mark.parametrize("argv, message", [
    (["eval", "{in}/latin1.yaml"], "is not UTF-8 text"),
    (["gate", "{in}/folder.yaml"], "is a folder"),
    (["eval", GOOD_SCENARIO, "--max-layers", "-3"], f"argument --max-layers: -3 {NOT_ALLOWED}"),
], ids=["eval-latin1", "gate-folder", "eval-max-layers"])
def test_the_sk_script_refuses_reported_cases_without_a_traceback(workspace, argv, message):
    """Some reported cases through the installed `sk` script (each start imports torch: seconds), as a user
    sees them; the cases above run the same code in process."""
    sk_script = Path(sys.executable).parent / "sk"
    env = os.environ | {"TMPDIR": str(workspace / "tmp"), "COLUMNS": "400"}
    before = tree(workspace)
    start = time.monotonic()
    done = subprocess.run([str(sk_script), *fill(argv, workspace)], cwd=workspace, env=env, capture_output=True,
                          text=True, timeout=120)
    elapsed = time.monotonic() - start
    output = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, output
    assert message.format(**{"in": workspace / "in"}) in output
    assert "Traceback" not in output
    assert tree(workspace) == before
    # Python and the package's imports only (torch: 6-9 s on a busy 2-core CPU); an engine start adds 27-55 s.
    assert elapsed < 25, elapsed
