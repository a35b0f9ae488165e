"""ci/gpu/chain.sh, the device session's background chain, driven as the device tool's calls drive it: start with
the first staged part, the other parts, polls; run.sh and engines.sh replaced by stand-ins that record their
calls (the real ones need the GPU host)."""
import os
import pathlib
import shutil
import subprocess
import tarfile

ROOT = pathlib.Path(__file__).parents[1]

RUN_SH = 'sleep ${SLEEP:-0}; mkdir -p "$1"; echo "run $SK_GPU_STEPS X=${X:-}" > "$1/ran.txt"\n'
ENGINES_SH = """if [ "$1" = install ]; then ls .gpu-flat/; exit 0; fi
mkdir -p "$2/s/$1"; echo "engine $1 Y=${Y:-}" > "$2/s/$1/ran.txt"; tar czf "$2/$1.tgz" -C "$2/s" "$1"; exit 1
"""


def chain(tree, work, *args, out=None):
    env = dict(os.environ, SK_CHAIN_DIR=str(work), **({"OUT": str(out)} if out else {}))
    return subprocess.run(["bash", "ci/gpu/chain.sh", *args], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=120)


def make_tree(tmp_path):
    tree = tmp_path / "tree"
    (tree / "ci/gpu").mkdir(parents=True)
    shutil.copy(ROOT / "ci/gpu/chain.sh", tree / "ci/gpu/chain.sh")
    (tree / "ci/gpu/run.sh").write_text(RUN_SH)
    (tree / "ci/gpu/engines.sh").write_text(ENGINES_SH)
    for part, name in (("part1", "a.whl"), ("part2", "b.whl")):
        (tree / ".gpu-stage" / part).mkdir(parents=True)
        (tree / ".gpu-stage" / part / name).write_text(name)
    return tree


def test_the_chain_runs_its_plan_in_order_and_installs_the_engines_once_every_part_is_in(tmp_path):
    tree, work, out = make_tree(tmp_path), tmp_path / "chain", tmp_path / "out"
    out.mkdir()
    (tree / "plan.txt").write_text("# a comment\nX=1 gpu:tests\n\nY=2 selftest-x\nY=2 selftest-x\nY=3 pair-x\n")
    assert chain(tree, work, "start", "plan.txt", ".gpu-stage/part1").returncode == 0
    first = chain(tree, work, "poll", "30", "begin 2", out=out)
    assert "end 1 gpu:tests exit 0" in first.stdout and "engines installed" not in first.stdout
    # The remaining steps can be replaced while the chain waits for the parts.
    assert chain(tree, work, "plan", "Y=2 selftest-x").returncode == 0
    assert "2 files staged" in chain(tree, work, "part", ".gpu-stage/part2", "--last").stdout
    done = chain(tree, work, "poll", "60", "chain end", out=out)
    assert "chain end" in done.stdout and done.stdout.count("begin 3 Y=2 selftest-x") == 1
    assert "pair-x" not in done.stdout  # replaced before it began; the same line again runs again
    assert (work / "res/install.log").read_text().split() == ["a.whl", "b.whl"]
    assert sorted(p.name for p in out.iterdir()) == ["1-tests.tgz", "2-selftest-x.log", "2-selftest-x.tgz",
                                                     "3-selftest-x.log", "3-selftest-x.tgz", "install.log"]
    with tarfile.open(out / "1-tests.tgz") as archive:
        assert archive.extractfile("./tests/ran.txt").read().decode().strip() == "run tests X=1"
    with tarfile.open(out / "3-selftest-x.tgz") as archive:
        assert archive.extractfile("selftest-x/ran.txt").read().decode().strip() == "engine selftest-x Y=2"
    assert "end 3 selftest-x exit 1" in done.stdout


def test_a_new_checkout_runs_from_the_next_step_on_and_never_under_a_running_one(tmp_path):
    # A fix made while the chain runs is measured by a later step of the same session (the host goes back 30 s
    # after a call returns: a new chain starts bare).
    tree, work, out = make_tree(tmp_path), tmp_path / "chain", tmp_path / "out"
    out.mkdir()
    (tree / "plan.txt").write_text("SLEEP=3 gpu:before\ngpu:after\n")
    assert chain(tree, work, "start", "plan.txt").returncode == 0
    (tree / "ci/gpu/run.sh").write_text(RUN_SH.replace('"run ', '"fixed '))
    (tree / ".gpu-stage/part2/b.whl").write_text("not carried into the tree")
    swapped = chain(tree, work, "tree")
    assert swapped.returncode == 0 and "the next step to begin runs this checkout" in swapped.stdout
    done = chain(tree, work, "poll", "60", "chain end", out=out)
    progress = done.stdout.splitlines()
    assert [line.split(" ", 1)[1].split(" by ")[0] for line in progress[1:6]] == [
        "begin 1 SLEEP=3 gpu:before", "end 1 gpu:before exit 0", "tree replaced", "begin 2 gpu:after",
        "end 2 gpu:after exit 0"]
    for archive_name, ran in (("1-before.tgz", "run before X="), ("2-after.tgz", "fixed after X=")):
        with tarfile.open(out / archive_name) as archive:
            assert archive.extractfile(f"./{archive_name[2:-4]}/ran.txt").read().decode().strip() == ran
    assert not (work / "tree/.gpu-stage").exists()
    assert chain(tmp_path / "tree", tmp_path / "bare", "tree").stdout.strip() == "BARE HOST"


def test_a_bare_host_answers_at_once_and_bad_calls_name_what_is_missing(tmp_path):
    tree, work = make_tree(tmp_path), tmp_path / "chain"
    for args in (("poll", "600", "x"), ("part", ".gpu-stage/part2"), ("plan", "gpu:tests")):
        bare = chain(tree, work, *args)
        assert (bare.returncode, bare.stdout.strip()) == (3, "BARE HOST")
    missing = chain(tree, work, "start", "no-plan.txt")
    assert missing.returncode == 2 and "no plan file 'no-plan.txt'" in missing.stderr
    (tree / "plan.txt").write_text("gpu:tests\n")
    assert chain(tree, work, "start", "plan.txt").returncode == 0  # no engine step: no part needed
    assert "end 1 gpu:tests exit 0" in chain(tree, work, "poll", "30", "chain end").stdout
    wrong = chain(tree, work, "part", ".gpu-stage/part9")
    assert wrong.returncode == 2 and "no staged part folder '.gpu-stage/part9'" in wrong.stderr


def _known_steps():
    """run.sh's steps (its `case` labels) and engines.sh's (glob patterns: selftest-*, ...)."""
    import re

    def labels(script):
        text = re.sub(r"\|\\\n\s*", "|", (ROOT / "ci/gpu" / script).read_text())
        return {label for line in re.findall(r"^\s+([\w.*|-]+)\)", text, re.M) for label in line.split("|")}

    return labels("run.sh"), labels("engines.sh") - {"*"}


def test_the_committed_plans_name_only_steps_the_scripts_know():
    import fnmatch

    run_steps, engine_steps = _known_steps()
    assert {"tests", "gated-mlp"} <= run_steps and {"reload", "bench-gated-mlp", "selftest-*"} <= engine_steps
    plans = sorted((ROOT / "ci/gpu/plans").glob("*.plan"))
    assert plans
    for plan in plans:
        for line in plan.read_text().splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            words = line.split()
            step = words[-1]
            assert all("=" in w for w in words[:-1]), f"{plan.name}: {line!r}: VAR=value ... STEP"
            if step.startswith("gpu:"):
                assert step[4:] in run_steps, f"{plan.name}: {step} is not a step of ci/gpu/run.sh"
            else:
                assert any(fnmatch.fnmatchcase(step, p) for p in engine_steps), \
                    f"{plan.name}: {step} is not a step of ci/gpu/engines.sh"
            if step.startswith(("selftest-", "pair-", "profile-")):
                assert (ROOT / "scenarios" / f"h200-{step.split('-', 1)[1]}.yaml").is_file(), f"{plan.name}: {step}"


def test_slim_takes_out_only_the_results_no_step_reads_and_unslim_brings_back_only_those(tmp_path):
    # The device tool carries the working tree and one staged part, 64 MiB in all: slim makes room; unslim must
    # not undo edits made in between (a results summary written while the chain runs).
    tree = make_tree(tmp_path)
    results = tree / "results" / "a"
    files = {"README.md": "summary\n", "x/trace.json.gz": "t", "x/run.tgz": "a", "x/chart.png": "p",
             "x/data.json": "{}"}
    for name, text in files.items():
        (results / name).parent.mkdir(parents=True, exist_ok=True)
        (results / name).write_text(text)
    git = dict(cwd=tree, check=True, capture_output=True)
    subprocess.run(["git", "init", "-q"], **git)
    subprocess.run(["git", "add", "results"], **git)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "r"], **git)
    assert chain(tree, tmp_path / "chain", "slim").returncode == 0
    assert sorted(n for n in files if (results / n).exists()) == ["README.md", "x/data.json"]
    (results / "README.md").write_text("summary, edited\n")
    (results / "x/data.json").unlink()  # removed by hand, not by slim: stays removed
    done = chain(tree, tmp_path / "chain", "unslim")
    assert done.returncode == 0 and "0 files still missing" in done.stdout
    assert sorted(n for n in files if (results / n).exists()) == sorted(set(files) - {"x/data.json"})
    assert (results / "README.md").read_text() == "summary, edited\n"
    done = chain(tree, tmp_path / "chain", "unslim")  # nothing left to bring back
    assert done.returncode == 0 and "0 files still missing" in done.stdout
