"""sk.settings: the one place that reads the package's environment variables, and its README table."""
import pathlib
import re
import threading

import pytest

import sk

ROOT = pathlib.Path(__file__).parents[1]


def test_readme_settings_table_is_generated_from_the_settings():
    readme = (ROOT / "README.md").read_text()
    table = readme.split("<!-- settings-table:begin -->\n")[1].split("\n<!-- settings-table:end -->")[0]
    assert table == sk.settings.markdown_table(), "README table is stale: paste sk.settings.markdown_table()"


def test_no_module_outside_settings_reads_a_package_variable():
    """Package code names a variable only through sk.settings (the CI scripts and tests have their own)."""
    names = {s.env for s in sk.settings.SETTINGS.values()}
    pattern = re.compile(r"""(environ\.get\(|environ\[|getenv\()\s*["'](SK_\w+|TRITON_INTERPRET)""")
    offenders = []
    for folder in ("sk_core", "adapters", "standardkernels"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "settings.py" and path.parent.name == "sk_core":
                continue
            for match in pattern.finditer(path.read_text()):
                offenders.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    # The exported kernel module is vendored into the engines, where sk.settings does not exist.
    offenders = [o for o in offenders if not o.startswith("sk_core/export/kernel_module.py")]
    assert offenders == []
    assert {"SK_STRICT", "SK_ADAPTERS", "SK_REPORT_DIR", "SK_GEGLU_CUTE", "TRITON_INTERPRET"} <= names


def test_switches_are_read_once_and_reloaded_on_request(monkeypatch):
    monkeypatch.setenv("SK_GEGLU_CUTE", "0")
    sk.settings.reload()
    assert sk.settings.get("geglu_cute") is False
    monkeypatch.setenv("SK_GEGLU_CUTE", "1")
    assert sk.settings.get("geglu_cute") is False  # kept from the first read
    sk.settings.reload()
    assert sk.settings.get("geglu_cute") is True
    monkeypatch.delenv("SK_GEGLU_CUTE")
    sk.settings.reload()
    assert sk.settings.get("geglu_cute") is True  # the default


def test_live_settings_follow_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SK_ADAPTERS", "vllm, sglang")
    assert sk.settings.get("adapters") == ("vllm", "sglang")
    monkeypatch.setenv("SK_REPORT_DIR", str(tmp_path))
    assert sk.settings.get("report_dir") == tmp_path
    monkeypatch.delenv("SK_REPORT_DIR")
    assert sk.settings.get("report_dir") is None


def test_override_is_scoped_to_the_block_and_the_thread():
    before = sk.settings.get("geglu_pdl")
    seen_in_thread = []
    with sk.settings.override(geglu_pdl=not before):
        assert sk.settings.get("geglu_pdl") is (not before)
        with sk.settings.override(geglu_cute=False):
            assert sk.settings.get("geglu_pdl") is (not before) and sk.settings.get("geglu_cute") is False
        thread = threading.Thread(target=lambda: seen_in_thread.append(sk.settings.get("geglu_pdl")))
        thread.start()
        thread.join()
    assert sk.settings.get("geglu_pdl") is before
    assert seen_in_thread == [before]


def test_unknown_setting_names_the_known_ones():
    with pytest.raises(KeyError, match="geglu_cute"):
        sk.settings.get("gelgu_cute")
    with pytest.raises(KeyError, match="unknown setting"):
        with sk.settings.override(nonsense=1):
            pass


def test_stock_environment_drops_the_engine_switches():
    env = {"SK_ADAPTERS": "vllm", "SK_STRICT": "1", "SK_REPORT_DIR": "/r", "SK_CANDIDATE_DIR": "c", "PATH": "/bin"}
    assert sk.settings.stock_environment(env) == {"SK_CANDIDATE_DIR": "c", "PATH": "/bin"}
    assert sk.settings.stock_environment(env, also=("candidate_dir",)) == {"PATH": "/bin"}


def test_strict_mode_default_comes_from_settings():
    assert sk.coverage.is_strict() is sk.settings.get("strict")
