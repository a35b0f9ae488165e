"""results/ holds records, not code: data and one summary per area, every area reachable from results/README.md."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"


def test_results_hold_no_code():
    assert not sorted(p.relative_to(REPO).as_posix() for p in RESULTS.rglob("*.py"))


def test_every_area_has_a_summary_listed_in_the_index():
    index = (RESULTS / "README.md").read_text()
    for area in sorted(p for p in RESULTS.glob("*/*") if p.is_dir()):
        relative = area.relative_to(RESULTS).as_posix()
        assert (area / "README.md").is_file(), f"{relative} has no README.md"
        assert f"]({relative}/README.md)" in index, f"results/README.md does not list {relative}"


def test_summary_links_resolve():
    for summary in [RESULTS / "README.md", *RESULTS.glob("*/*/README.md")]:
        for target in re.findall(r"\]\(([^)#]+)\)", summary.read_text()):
            assert (summary.parent / target).exists(), f"{summary.relative_to(REPO)} links {target}"
