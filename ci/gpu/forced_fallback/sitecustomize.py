"""GPU check only (ci/gpu/serve_check.py): in every Python process that has this folder on PYTHONPATH, each
sk op call falls outside the coverage table, as on a GPU our kernels do not cover: a recorded fallback, and
under strict mode a CoverageError. This is how the check reaches sk-serve's strict-violation path on an sm90
host, where every call of the engines' bf16 layers is covered."""
import importlib.abc
import importlib.util
import sys

REASON = "forced outside coverage by ci/gpu/forced_fallback"


class _PatchCoverage(importlib.abc.MetaPathFinder):
    """Patches sk.coverage.miss_reason once `sk` is imported (processes that never import sk stay light)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "sk":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            module.coverage.miss_reason = lambda *args, **kwargs: REASON

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchCoverage())
