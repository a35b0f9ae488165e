"""Per-process reports kept written (sk.reports.keep_report_written): at registration, while counts change, at
once at a strict violation, and in a forked child that never reaches its exit handlers."""
import json
import os
import subprocess
import sys

CHILD = """
import json, os, time, torch, sk

def load(pid):
    return json.loads((sk.settings.get("report_dir") / f"vllm-{pid}.json").read_text())["coverage"]

def calls(pid):
    return sum(f["count"] for f in load(pid)["fallbacks"])

wait = sk.reports.REPORT_INTERVAL_S + 0.5
sk.reports.keep_report_written("vllm", lambda: sk.reports.process_report("vllm", {}, 0))
assert calls(os.getpid()) == 0, "written at registration"
sk.ops.rms_norm(torch.ones(2, 8), torch.ones(8))
time.sleep(wait)
assert calls(os.getpid()) == 1, "rewritten while running"
writes = sk.reports.write_intervals()
assert len(writes) == 2 and all(s >= 0 for _, s in writes) and writes[0][0] < writes[1][0], "each write timed"
with sk.coverage.strict():
    try:
        sk.ops.rms_norm(torch.ones(3, 8), torch.ones(8))
    except sk.CoverageError:
        pass
assert load(os.getpid())["strict_violation"]["shapes"] == [[3, 8], [8]], "written at the violation"
child = os.fork()
if child == 0:
    sk.ops.silu_and_mul(torch.ones(2, 8))
    time.sleep(wait)
    os._exit(0)  # no exit handlers: only the child's own writer thread wrote its report
os.waitpid(child, 0)
assert calls(child) == 2, "the forked child's writer"
print("ok")
"""


def test_reports_are_kept_written(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("SK_ADAPTERS", "SK_STRICT", "TRITON_INTERPRET")}
    done = subprocess.run([sys.executable, "-c", CHILD], env={**env, "SK_REPORT_DIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
    assert len(list(tmp_path.glob("vllm-*.json"))) == 2 and not list(tmp_path.glob("*.tmp"))
    assert all(json.loads(p.read_text())["schema"] == "standardkernels.adapter-report/1" for p in tmp_path.iterdir())
