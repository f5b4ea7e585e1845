"""Every figure the README or docs quote from a machine has its record in data/ (issue 39, part 4).

A quoted machine figure sits in a paragraph that links the file it comes from (``data/...json``); that
file names the machine, the command, the date and whether the machine was real or an imitation, and holds
every decimal figure the paragraph prints (at the digits printed). A paragraph that says a machine
"recorded" or "measured" a figure without such a link fails.
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\((?:\.\./)?(data/[\w./-]+\.json)\)")
FIGURE = re.compile(r"(?<![\d.])(\d+\.\d+)(?![\d.])")  # 0.184, not the version 2.14.1
MACHINE = re.compile(r"EPYC|Xeon|Zen \d|Emerald Rapids|V100|A100|H100|H200|Graviton|Apple M\d")
CLAIM = re.compile(r"\b(recorded|measured|ran)\b")


def paragraphs(path: Path) -> list[str]:
    """Blank-line separated blocks and list items, tables and code left out (tables are generated
    from the records and compared with them by tests/test_course_stats.py)."""
    blocks = re.split(r"\n\s*\n|\n(?=- )", path.read_text())
    return [" ".join(b.split()) for b in blocks if not b.lstrip().startswith(("|", "```"))]


def numbers(value) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers(v)]
    return []


def holds(record: dict, figure: str) -> bool:
    decimals = len(figure.split(".")[1])
    return any(round(n, decimals) == float(figure) or f"{n:.3g}" == figure for n in numbers(record))


QUOTED = [(path, text) for path in DOCUMENTS for text in paragraphs(path) if LINK.search(text)]


@pytest.mark.parametrize("path, text", QUOTED, ids=[f"{p.name}:{t[:40]}" for p, t in QUOTED])
def test_a_quoted_figure_is_in_the_record_it_links(path, text):
    for link in LINK.findall(text):
        record = json.loads((ROOT / link).read_text())
        assert record.get("machine") and record.get("command"), link
        assert re.match(r"\d{4}-\d{2}-\d{2}", record.get("created", "")), link
        assert record.get("real_or_imitation") in ("real", "imitation"), link
        if record["real_or_imitation"] == "imitation":
            assert "imitation" in text, f"{link} is an imitation: the text must say so"
    records = [json.loads((ROOT / link).read_text()) for link in LINK.findall(text)]
    for figure in FIGURE.findall(text):
        assert any(holds(r, figure) for r in records), f"{figure} is in no linked record ({path.name})"


@pytest.mark.parametrize("path", DOCUMENTS, ids=[p.name for p in DOCUMENTS])
def test_no_machine_figure_without_its_record(path):
    for text in paragraphs(path):
        if MACHINE.search(text) and CLAIM.search(text) and FIGURE.search(text):
            assert LINK.search(text), f"a machine's figure without its data/ record: {text[:160]}"


def test_the_withdrawn_figures_stay_out():
    """No record, no source: the README's AVX2 EPYC figures, 06's V100 result."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "recorded 2026-12-01" not in readme and "0.68-0.78x" not in readme
    notebook_06 = (ROOT / "notebooks" / "06_deploying_half_precision.ipynb").read_text()
    assert "V100 results" not in notebook_06


def test_a_paragraph_without_its_record_fails(tmp_path):
    """The check has teeth: a figure named beside a machine with no link is caught."""
    fake = tmp_path / "fake.md"
    fake.write_text("Intro.\n\nOn a real AMD EPYC fp16 measured 0.68x float32.\n")
    with pytest.raises(AssertionError, match="without its data/ record"):
        test_no_machine_figure_without_its_record(fake)
