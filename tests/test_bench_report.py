"""The benchmark report keeps what no phase measured when some sections are measured again (`--only`):
sections written by scripts of their own, whole, and notes added by hand to a generated section."""

from __future__ import annotations

from pathlib import Path

from bench.common import Section
from bench.report import previous_report, render

META = {"mode": "full", "history": [{"command": "python -m bench", "finished": "then", "took_min": 1.0, "sections": [1, 3]}],
        "machine": {"cpu": "test"}}


def _section(number: int, value: str) -> Section:
    return Section(number, f"measure {number}", "a target", ["what", "value"], [["it", value]], "met",
                   notes=[f"note of {number}"], raw={"samples": [number]}, headline=value)


def test_sections_no_phase_wrote_and_hand_notes_survive_a_regeneration(tmp_path: Path) -> None:
    report = tmp_path / "bench.md"
    text = render([_section(1, "1.5 s"), _section(3, "3.5 s")], META)
    by_hand = ("## 2. Written by hand\n\nMeasured by `python -m bench.other`.\n\n| a | b |\n|---|---|\n| x | 2.0 s |\n\n"
               "- a hand note of 2\n")
    text = text.replace("## 3. measure 3", by_hand + "\n## 3. measure 3")
    text = text.replace("| 3 | measure 3 |", "| 2 | Written by hand | report | 2.0 s | reported |\n| 3 | measure 3 |")
    text = text.replace("- note of 3\n", "- note of 3\n- added by hand to 3\n")
    report.write_text(text)

    sections, history, kept = previous_report(report)
    assert sorted(sections) == [1, 3] and [k.number for k in kept] == [2]
    assert sections[3].notes == ["note of 3", "added by hand to 3"]
    sections[1] = _section(1, "1.1 s")  # measured again
    again = render(list(sections.values()), META, kept)

    assert "| it | 1.1 s |" in again and "| it | 1.5 s |" not in again
    assert by_hand.rstrip() in again  # whole, between §1 and §3
    assert again.index("## 1. measure 1") < again.index("## 2. Written by hand") < again.index("## 3. measure 3")
    summary = again.split("## Summary", 1)[1].split("## 1.", 1)[0]
    assert summary.index("| 1 | measure 1 |") < summary.index("| 2 | Written by hand |") < summary.index("| 3 | measure 3 |")
    assert again.count("- added by hand to 3") == 1
    # and once more: nothing doubles, the hand-written section is still not generated
    report.write_text(again)
    sections, _, kept = previous_report(report)
    assert [k.number for k in kept] == [2] and sections[3].notes == ["note of 3", "added by hand to 3"]
    assert render(list(sections.values()), META, kept) == again
