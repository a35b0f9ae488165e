"""An engine's pristine Python sources, read from an installed package's parent folder or from a wheel.

Series paths are repository paths (vLLM `vllm/...`, SGLang `python/sglang/...`); installed packages and wheels
hold the package without the repository's prefix, which `package_prefix` maps.
"""
from __future__ import annotations

import importlib.util
import re
import zipfile
from pathlib import Path

# Repository path prefix -> where the package starts inside that repository.
PACKAGE_PREFIX = {"vllm": "", "sglang": "python/"}


class SourceTree:
    def __init__(self, engine: str, location: Path):
        self.engine = engine
        self.location = location
        self._wheel = zipfile.ZipFile(location) if location.suffix == ".whl" else None

    def _package_path(self, repo_path: str) -> str:
        prefix = PACKAGE_PREFIX[self.engine]
        if not repo_path.startswith(prefix):
            raise ValueError(f"{repo_path} is outside the {self.engine} package")
        return repo_path[len(prefix):]

    def read(self, repo_path: str) -> str | None:
        """The file's text, or None when the tree has no such file."""
        path = self._package_path(repo_path)
        if self._wheel is not None:
            return self._wheel.read(path).decode() if path in self._wheel.namelist() else None
        file = self.location / path
        return file.read_text() if file.is_file() else None

    def version(self) -> str:
        """The version in the package's generated `_version.py` (local labels such as `+cpu` dropped)."""
        text = self.read(f"{PACKAGE_PREFIX[self.engine]}{self.engine}/_version.py") or ""
        found = re.search(r"^__version__ = version = ['\"]([^'\"]+)['\"]", text, re.MULTILINE)
        if not found:
            raise ValueError(f"{self.location}: no {self.engine}/_version.py with a __version__")
        return found.group(1).split("+")[0]


def open_tree(engine: str, source: str | None) -> SourceTree:
    """`source`: a folder holding the `engine` package, or a wheel; default: the installed package's folder."""
    if source is None:
        spec = importlib.util.find_spec(engine)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"{engine} is not installed here; pass --source (a folder holding the {engine} "
                                    f"package, e.g. a site-packages, or a {engine} wheel)")
        return SourceTree(engine, Path(list(spec.submodule_search_locations)[0]).parent)
    location = Path(source)
    if not location.exists():
        raise FileNotFoundError(f"--source {source} does not exist")
    try:
        return SourceTree(engine, location)
    except (zipfile.BadZipFile, OSError) as e:
        raise ValueError(f"--source {source} is not a readable wheel ({e}); expected a folder holding the "
                         f"{engine} package or a {engine} wheel") from None
