"""What the studies' write-ups must show of their rendered tables."""

from __future__ import annotations

from pathlib import Path

STUDY = Path(__file__).resolve().parents[1] / "studies" / "decision-validity.md"


def assert_study_shows(rendered: str, study: Path = STUDY) -> None:
    """Every non-empty line of ``rendered`` is in ``study``'s text: the tables a write-up prints are the ones its
    recorded scores render (prose may stand between a renderer's tables)."""
    text = study.read_text()
    for line in rendered.splitlines():
        if line:
            assert line in text, line
