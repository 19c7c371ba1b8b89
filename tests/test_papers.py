"""nearlocal/data/papers.toml against the papers' digest (papers.md, kept beside the repository
in ../shared/): every figure's meaning and wording word for word, and every value's number, unit
and qualifier as the digest writes them. A copy of the digest ships in tests/fixtures/papers/ so
that a clone without ../shared still checks the figures; where the digest is present, the copy
must be it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from nearlocal.report.papers import Value, figures, stated

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "tests" / "fixtures" / "papers" / "papers.md"
DIGEST_ENV = "NEARLOCAL_PAPERS_DIGEST"  # a digest elsewhere (CI: <clone>/../shared/papers.md)


def live_digest() -> Path | None:
    """The project's digest: $NEARLOCAL_PAPERS_DIGEST, else shared/papers.md beside the clone
    (a git worktree's or a CI clone's ../shared) or inside it (the device machine's copy)."""
    given = os.environ.get(DIGEST_ENV)
    candidates = [Path(given)] if given else []
    candidates += [ROOT.parent / "shared" / "papers.md", ROOT / "shared" / "papers.md"]
    return next((path for path in candidates if path.is_file()), None)


def _flat(text: str) -> str:
    return " ".join(text.split())


def digest_rows(text: str) -> dict[str, tuple[str, str]]:
    """ID -> (what, figure) from the digest's `| ID | what | figure |` tables."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and cells[0] not in ("ID", "---"):
            rows[cells[0]] = (cells[1], cells[2])
    return rows


# A number as the digest writes one: an optional qualifier or sign, "$", digits (1,745 / 13.0),
# then the word or unit right after it.
_NUMBER = re.compile(r"(?P<q>~|>=|<=|<|(?<!-)>|\bup to)?\s*(?P<sign>(?<!\w)[-+])?(?P<usd>\$)?"
                     r"(?<![\w.,])(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?![\d])"
                     r"(?P<unit>\s*(?:GB/s|TB/s|%|[A-Za-z]+))?")
_UNITS = {"us", "ms", "s", "ns", "GB/s", "TB/s", "TB", "KB", "MB", "B", "%", "x", "Mops", "QPS"}
_JOINED = re.compile(r"^\s*(->|–|-|vs)\s*$")  # "1.54 -> 11.32 QPS": the unit is written once


def numbers(text: str) -> list[tuple[str, float, str]]:
    """(qualifier, value, unit) of each number in `text`: unit "USD" for "$", "" when the next
    word is no unit (a count: "128 non-contiguous"); a number joined to the next by "->", "-"
    or "vs" without a unit of its own takes that number's."""
    found = []
    matches = list(_NUMBER.finditer(text))
    for index, match in enumerate(matches):
        value = float(match["num"].replace(",", ""))
        value = -value if match["sign"] == "-" else value
        unit = (match["unit"] or "").strip()
        unit = "USD" if match["usd"] else (unit if unit in _UNITS else "")
        if not unit and index + 1 < len(matches):
            after = matches[index + 1]
            if _JOINED.match(text[match.end():after.start()]) and after["unit"]:
                unit = after["unit"].strip() if after["unit"].strip() in _UNITS else ""
        qualifier = match["q"] or ("+" if match["sign"] == "+" else "")
        found.append((qualifier, value, unit))
    return found


def _quoted(value: Value, written: list[tuple[str, float, str]]) -> list[str]:
    """What is wrong with `value` as a quote of `written` (empty: it is exact)."""
    unit = "" if value.unit == "count" else value.unit
    wanted = [value.value] if value.value is not None else [value.low, value.high]
    problems = []
    for number in wanted:
        same = [w for w in written if w[1] == number]
        if not same:
            problems.append(f"{value.name}: {number:g} is not written there")
        elif not any(w[2] == unit for w in same):
            problems.append(f"{value.name}: {number:g} is written in "
                            f"{sorted({w[2] or 'count' for w in same})}, not {value.unit}")
        elif value.value is not None and not any(w[2] == unit and w[0] == value.qualifier
                                                 for w in same):
            problems.append(f"{value.name}: the paper writes "
                            f"{sorted({w[0] or 'no qualifier' for w in same})} before "
                            f"{number:g}, not {value.qualifier or 'none'!r}")
    return problems


def mismatches(digest: str) -> list[str]:
    """Every difference between papers.toml and the digest's text, one line each."""
    rows = digest_rows(digest)
    out = [f"{i}: in the digest, not in papers.toml" for i in rows if i not in figures()]
    for fig in figures().values():
        if fig.id not in rows:
            out.append(f"{fig.id}: in papers.toml, not in the digest")
            continue
        what, text = rows[fig.id]
        if fig.what != what:
            out.append(f"{fig.id} what: {fig.what!r} != the digest's {what!r}")
        if fig.text != text:
            out.append(f"{fig.id} text: {fig.text!r} != the digest's {text!r}")
        written = numbers(f"{what} | {text}")
        out += [f"{fig.id} {problem}" for value in fig.values
                for problem in _quoted(value, written)]
    for fig in stated().values():  # the setting's hardware figures, quoted from its prose
        if _flat(fig.text) not in _flat(digest):
            out.append(f"{fig.id} text: {fig.text!r} is not in the digest")
        out += [f"{fig.id} {problem}" for value in fig.values
                for problem in _quoted(value, numbers(fig.text))]
    return out


# --- the checks ----------------------------------------------------------------------------------

def test_papers_toml_quotes_the_digest_exactly():
    digest = live_digest()
    if digest is None:
        pytest.skip(f"no papers digest: neither ${DIGEST_ENV} nor ../shared/papers.md beside "
                    f"the clone ({ROOT.parent / 'shared'}); the shipped copy is checked instead")
    assert mismatches(digest.read_text(encoding="utf-8")) == []


def test_papers_toml_quotes_the_shipped_copy_exactly():
    """Runs in any clone: the figures against the digest's copy in tests/fixtures/papers/."""
    assert mismatches(SHIPPED.read_text(encoding="utf-8")) == []


def test_every_digest_id_is_a_figure_and_every_figure_says_it_was_reported():
    rows = digest_rows(SHIPPED.read_text(encoding="utf-8"))
    assert set(rows) == set(figures())
    assert all(f.provenance == "reported by the paper" for f in figures().values())


def test_a_stated_figure_is_kept_apart_and_says_it_is_no_measurement():
    switch = stated()["beluga-switch"]
    assert "beluga-switch" not in figures()  # nothing compares a measurement with it
    assert switch.provenance.startswith("stated by the vendor/paper")
    assert switch.value("aggregate bandwidth").text() == "1 TB/s"
    assert "not a measurement" in switch.text and "two servers" in switch.text


# --- the checker itself: it must catch what issue 56 found ---------------------------------------

DIGEST_ROW = ("| B12 | GPU <-> pool bandwidth | capped at 26 GB/s per adapter; one pool memory "
              "device tops at 22.5 GB/s; 2 MB software interleaving (+33.2% serving "
              "throughput) |\n| B1 | RDMA, 16 KB: total vs data movement | 10.55 us vs 2.68 us "
              "(~75% is synchronisation) |\n| B16 | QPS | 1.54 -> 11.32 QPS; 3.41x - 9.47x |\n")


def test_numbers_reads_units_qualifiers_signs_and_shared_units():
    written = numbers(DIGEST_ROW)
    assert ("+", 33.2, "%") in written and ("", 22.5, "GB/s") in written
    assert ("~", 75.0, "%") in written and ("", 2.0, "MB") in written
    assert ("", 1.54, "QPS") in written  # the unit after "->"
    assert ("", 3.41, "x") in written and ("", 9.47, "x") in written
    assert numbers("$1,745 vs $218.75; 5,260 us (-95.9%); Qwen-32B; 128 pieces") == [
        ("", 1745.0, "USD"), ("", 218.75, "USD"), ("", 5260.0, "us"), ("", -95.9, "%"),
        ("", 32.0, "B"), ("", 128.0, "")]


@pytest.mark.parametrize("value, problem", [
    (Value("gain", "%", 33.0, qualifier="+"), "33 is not written there"),  # "+33 %"
    (Value("gain", "%", 33.2), "writes ['+'] before 33.2, not 'none'"),  # the paper's "+" dropped
    (Value("device", "MB", 22.5), "not MB"),  # the right number in another unit
    (Value("aggregate", "GB/s", 1000), "1000 is not written there"),  # not in the table at all
])
def test_a_misquote_is_named(value, problem):
    (found,) = _quoted(value, numbers(DIGEST_ROW))
    assert problem in found


def test_a_changed_wording_is_a_mismatch():
    shipped = SHIPPED.read_text(encoding="utf-8")
    changed = shipped.replace("| GPU <-> pool bandwidth |", "| pool -> GPU bandwidth |")
    assert [m for m in mismatches(changed) if m.startswith("B12")] == [
        "B12 what: 'GPU <-> pool bandwidth' != the digest's 'pool -> GPU bandwidth'"]
    rounded = mismatches(shipped.replace("+33.2%", "+33%"))
    assert any(m.startswith("B12 text:") for m in rounded)
    assert "B12 serving throughput gain: 33.2 is not written there" in rounded
