"""Copy the tables the full runs wrote (``studies/results/<stem>.md``) into ``studies/paper-experiments.md``.

``studies/paper-experiments.md`` marks each table as

    <!-- table: images_depth_sweep -->
    ... (replaced) ...
    <!-- end table -->

and this script replaces everything between the markers with the current
file (the special table ``runs`` lists every run's command, wall time,
data and versions from the JSON files), so the page always shows what the scripts last produced.  ``--check``
exits 1 (naming the table) when the page is out of date, changing nothing.

    python -m examples.update_results_page [--check]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

STUDIES = Path(__file__).resolve().parents[1] / "studies"
PAGE = STUDIES / "paper-experiments.md"
RESULTS = STUDIES / "results"
MARKER = re.compile(r"(<!-- table: (?P<stem>[\w-]+) -->\n)(?P<body>.*?)(<!-- end table -->)", re.S)


def runs_table() -> str:
    """One line per full-run table: command, wall time, when, data, versions (from the JSON ``meta``)."""
    lines = ["| table | command | wall time (s) | written | data | versions |", "|---|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("*.json")):
        meta = json.loads(path.read_text()).get("meta")
        if meta is None:  # not a run's table: the expansion studies' measured costs share the folder
            continue
        parts = {name: part for name, part in meta.items() if isinstance(part, dict) and "seconds" in part}
        if "seconds" not in meta and parts:  # a bench run in parts (studies/decision_validity.py): their sum
            meta = {"seconds": sum(part["seconds"] for part in parts.values()),
                    "written": max(str(part.get("written", "")) for part in parts.values()),
                    "data": f"{len(parts)} parts, seconds summed: {', '.join(sorted(parts))}"}
        versions = ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items())
        data = meta.get("data", meta.get("model", ""))
        lines.append(f"| {path.stem} | `{meta.get('command', '')}` | {meta.get('seconds', float('nan')):.0f} | "
                     f"{meta.get('written', '')} | {data} | {versions} |")
    return "\n".join(lines) + "\n"


def updated(text: str) -> tuple[str, list[str]]:
    """The page with every marked table replaced, and the stems whose content changed."""
    changed = []

    def replace(match):
        source = RESULTS / f"{match['stem']}.md"
        if match["stem"] == "runs":
            body = runs_table()
        else:
            body = source.read_text() if source.exists() else f"*(not yet run: {source.name} missing)*\n"
        if body != match["body"]:
            changed.append(match["stem"])
        return match.group(1) + body + match.group(4)

    return MARKER.sub(replace, text), changed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report tables that are out of date")
    args = parser.parse_args()
    text, changed = updated(PAGE.read_text())
    if args.check:
        if changed:
            print(f"studies/paper-experiments.md is out of date for: {', '.join(changed)}", file=sys.stderr)
            sys.exit(1)
        print("studies/paper-experiments.md is up to date")
        return
    PAGE.write_text(text)
    print(f"updated {len(changed)} table(s): {', '.join(changed) or 'none'}")


if __name__ == "__main__":
    main()
