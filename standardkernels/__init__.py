"""`standardkernels` is the long name of the `sk` package: every `standardkernels.X` is the very module `sk.X`.

A meta-path finder maps each `standardkernels.<sub>` import onto `sk.<sub>`, so no module is executed twice
and objects compare identical under both names.
"""
import importlib
import importlib.abc
import importlib.util
import sys

_ALIAS, _TARGET = "standardkernels", "sk"


class _AliasLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return importlib.import_module(_TARGET + spec.name[len(_ALIAS):])

    def exec_module(self, module):
        # The target module is already executed; the alias only binds the name.
        pass


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_ALIAS + "."):
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader())


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())
sys.modules[__name__] = importlib.import_module(_TARGET)
# Modules `sk` has loaded get their long names now: importing one through the finder would also rebind the
# parent's attribute to the module (e.g. `sk.ops.rms_norm`, the function, to the file `sk_core/ops/rms_norm.py`).
for _name, _module in list(sys.modules.items()):
    if _name.startswith(_TARGET + "."):
        sys.modules.setdefault(_ALIAS + _name[len(_TARGET):], _module)
