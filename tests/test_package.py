"""The package under both names, and the README's coverage table matching the coverage data."""
import importlib
import pathlib
import re
import subprocess
import sys

import sk


def test_standardkernels_is_sk_under_its_long_name():
    import standardkernels
    from standardkernels.coverage import strict, write_report
    from standardkernels.ops import rms_norm

    assert standardkernels is sk
    assert standardkernels.ops is sk.ops and rms_norm is sk.ops.rms_norm
    assert strict is sk.coverage.strict and write_report is sk.coverage.write_report
    assert importlib.import_module("standardkernels.ops.rms_norm") is importlib.import_module("sk.ops.rms_norm")
    assert standardkernels.CoverageError is sk.CoverageError


def test_long_name_first_in_a_fresh_process_imports_each_module_once():
    code = (
        "import sys, standardkernels.ops, standardkernels.coverage as c, sk\n"
        "assert c is sk.coverage and standardkernels.ops is sk.ops\n"
        "long = {k: m for k, m in sys.modules.items() if k.startswith('standardkernels.')}\n"
        "assert long and all(m is sys.modules['sk' + k[len('standardkernels'):]] for k, m in long.items())\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_readme_coverage_table_is_generated_from_the_data():
    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    table = readme.split("<!-- coverage-table:begin -->\n")[1].split("\n<!-- coverage-table:end -->")[0]
    assert table == sk.coverage.markdown_table(), "README table is stale: paste the output of `sk list --markdown`"


def test_cli_list_prints_every_op(capsys):
    from sk.cli import main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for op in sk.coverage.table():
        assert op in out


def test_importing_an_op_file_by_either_name_keeps_the_op_function():
    importlib.import_module("standardkernels.ops.rms_norm")
    importlib.import_module("sk.ops.act_and_mul")
    assert callable(sk.ops.rms_norm) and callable(sk.ops.silu_and_mul)


def test_the_core_does_not_import_the_adapters():
    """Dependencies point one way: sk.adapters builds on sk_core/, never the reverse (sk-serve is an adapter)."""
    root = pathlib.Path(__file__).parents[1]
    offenders = [f"{path.relative_to(root)}:{n}" for path in (root / "sk_core").rglob("*.py")
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if re.search(r"^\s*(from|import)\s+(sk|standardkernels)\.adapters\b|from\s+sk\s+import\s+adapters", line)]
    assert offenders == []
