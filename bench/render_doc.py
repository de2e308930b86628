"""Render ``docs/benchmarks.md`` from ``bench/results.json`` and ``bench/benchmarks_template.md``.

The template is a Python f-string body: every number in the page is read from
``results.json``, so the page cannot drift from the measurements.  Run after
``python bench/run_all.py``.
"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
R = json.loads((HERE / "results.json").read_text())
S = R["sections"]
po = S["probe_overhead"]
W = po["workloads"]
g, rn = W["gpt2"], W["resnet8"]
pe = S["peers"]["workloads"]
pg, pr = pe["gpt2"], pe["resnet8"]
sc = S["scaling"]
core = S["core"]
sd = S["score_dump"]


def x(v, d=2):
    return f"{v:.{d}f}x"


def e(v):
    return f"{v:.1e}"


def vs(ratio):
    if ratio > 1.1:
        return f"{ratio:.2f}x satcore's time (satcore {ratio:.1f}x faster)"
    if ratio < 0.9:
        return f"{ratio:.2f}x satcore's time (satcore {1 / ratio:.1f}x slower)"
    return f"level ({ratio:.2f}x)"


def mb(b):
    return f"{b / 1e6:.0f}"


def pct(w, k):
    b = w["default_breakdown_seconds"]
    return f"{b[k] / b['total']:.0%}"


versioned = [v["versions"] for v in S.values() if isinstance(v, dict) and "versions" in v]
loads = [v["load_average_1min"] for v in versioned if "load_average_1min" in v]
commits = sorted({v.get("commit") for v in versioned if v.get("commit")})
dirty = sorted({u for v in versioned for u in v.get("uncommitted", [])})
goal_g = g["ratio"]["default"] <= 1.5
goal_r = rn["ratio"]["default"] <= 1.5

if __name__ == "__main__":
    template = (HERE / "benchmarks_template.md").read_text()
    namespace = dict(globals())
    exec('out = f"""' + template + '"""', namespace)  # noqa: S102 - our own template, not input
    out = namespace["out"]
    (HERE.parent / "docs" / "benchmarks.md").write_text(out)
    print("rendered docs/benchmarks.md:", len(out), "characters")
