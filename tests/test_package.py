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


# ------------------------------------------------------------------------------------ the gated-MLP family package

FAMILY = pathlib.Path(__file__).parents[1] / "sk_core" / "ops" / "gated_mlp"
FAMILY_MODULE = "sk.ops.gated_mlp"


def _family_imports(path: pathlib.Path) -> set[str]:
    """The package's own modules that `path` imports (import statements and `importlib.import_module("...")`)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else f"{FAMILY_MODULE}.{node.module}"
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        found |= {n[len(FAMILY_MODULE) + 1:].split(".")[0] for n in names if n.startswith(FAMILY_MODULE + ".")}
    return found


def test_the_family_package_has_no_import_cycle():
    """Imports among sk/ops/gated_mlp's modules form a DAG (any order of first import works), and each module
    imports in a fresh interpreter on its own."""
    graph = {p.stem: _family_imports(p) - {p.stem} for p in FAMILY.glob("*.py") if p.stem != "__init__"}
    graph = {m: deps & graph.keys() for m, deps in graph.items()}
    done, path = set(), []

    def visit(m):
        if m in path:
            raise AssertionError(f"import cycle: {' -> '.join(path[path.index(m):] + [m])}")
        if m not in done:
            path.append(m)
            for dep in sorted(graph[m]):
                visit(dep)
            path.pop()
            done.add(m)
    for m in sorted(graph):
        visit(m)
    # quack_gemms imports QuACK and is only imported through quack_backend.available (where QuACK is installed).
    modules = [f"{FAMILY_MODULE}.{m}" for m in sorted(graph) if m != "quack_gemms"]
    for first in modules:
        subprocess.run([sys.executable, "-c", f"import {first}; import sk.ops; "
                        "assert callable(sk.ops.fused_pre_norm_geglu) and callable(sk.ops.fused_gated_mlp)"],
                       check=True)


def test_nothing_outside_the_family_package_uses_its_private_names():
    """tests/ and benchmarks/ reach the package only through public or documented-internal names: no
    `from sk.ops.gated_mlp... import _name`, no `module._name` on a name bound to one of its modules, no
    `getattr`/`setattr`/monkeypatch of a `_name` on one."""
    import ast

    root = pathlib.Path(__file__).parents[1]
    offenders = []
    for path in sorted((root / "tests").rglob("*.py")) + sorted((root / "benchmarks").rglob("*.py")):
        tree = ast.parse(path.read_text())
        bound = set()  # local names bound to the package or one of its modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(FAMILY_MODULE):
                for a in node.names:
                    if a.name.startswith("_"):
                        offenders.append(f"{path.relative_to(root)}:{node.lineno}: imports {a.name}")
                    bound.add(a.asname or a.name)
            elif isinstance(node, ast.Import):
                bound |= {a.asname for a in node.names if a.asname and a.name.startswith(FAMILY_MODULE)}
            elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                  and getattr(node.value.func, "attr", None) == "import_module" and node.value.args
                  and isinstance(node.value.args[0], ast.Constant)
                  and str(node.value.args[0].value).startswith(FAMILY_MODULE)):
                bound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in bound):
                offenders.append(f"{path.relative_to(root)}:{node.lineno}: {node.value.id}.{node.attr}")
            elif (isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[0], ast.Name)
                  and node.args[0].id in bound and isinstance(node.args[1], ast.Constant)
                  and str(node.args[1].value).startswith("_")):
                offenders.append(f"{path.relative_to(root)}:{node.lineno}: {node.args[0].id}, {node.args[1].value!r}")
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and node.value.startswith(FAMILY_MODULE) and "._" in node.value):
                offenders.append(f"{path.relative_to(root)}:{node.lineno}: {node.value}")
    assert offenders == []


def test_the_old_geglu_modules_are_gone():
    """The GEGLU op lives in the family package; its old modules are not importable (no shims)."""
    import importlib.util

    ops = pathlib.Path(__file__).parents[1] / "sk_core" / "ops"
    for old in ("fused_pre_norm_geglu", "fused_pre_norm_geglu_cute"):
        assert not (ops / f"{old}.py").exists() and importlib.util.find_spec(f"sk.ops.{old}") is None, old
    assert callable(sk.ops.fused_pre_norm_geglu)  # the name is the function, not a module
    assert sk.ops.fused_pre_norm_geglu.__module__ == "sk.ops.gated_mlp.geglu"
