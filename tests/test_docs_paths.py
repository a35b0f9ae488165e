"""Every path of this repository named in a docstring, comment, README or note exists, so a reader can follow it."""
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).parents[1]
TOP = ("sk_core", "adapters", "standardkernels", "tests", "ci", "benchmarks", "results", "models", "scenarios",
       "upstream_patches")
# A repository path: one of the top-level folders, then path segments (placeholders such as <style> end it).
PATH = re.compile(r"(?<![\w./<>-])((?:%s)(?:/[\w.-]+)+/?)" % "|".join(TOP))
TEXT = (".py", ".md", ".sh", ".toml", ".yaml", ".txt")
# Generated or data files that quote other trees' paths (patches against the engines, engine-side notes).
SKIP = ("upstream_patches/", "results/", "models/trained/")
# Named on purpose though not in this tree: vLLM's test folder (the exported series add a file there), and
# output folders the CLI creates on first use.
ELSEWHERE = {"tests/kernels/core", "tests/kernels/core/test_standard_kernels.py", "results/bench", "results/eval",
             "results/profile"}


def named_paths():
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for name in files:
        if not name.endswith(TEXT) or name.startswith(SKIP) or not (ROOT / name).is_file():
            continue
        for n, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1):
            for match in PATH.finditer(line):
                yield name, n, match.group(1).rstrip("./")


def test_every_repository_path_named_in_the_tree_exists():
    missing = [f"{name}:{n}: {path}" for name, n, path in named_paths()
               if not (ROOT / path).exists() and path not in ELSEWHERE and not path.endswith("_")]
    assert missing == []
