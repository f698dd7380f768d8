"""Names, files and dates as the memory service accepts them (pure functions)."""

from __future__ import annotations

import datetime as dt

import pytest

from loki_memory import names
from loki_shared.errors import InvalidRequest


@pytest.mark.parametrize(
    ("given", "slug"),
    [
        ("Diet notes", "diet-notes"),
        ("  Café — été 2026! ", "cafe-ete-2026"),
        ("snake_case OK", "snake_case-ok"),
        ("x" * 60, "x" * names.SLUG_MAX),
        ("Ｆｕｌｌ－ｗｉｄｔｈ", "full-width"),
        # any script's letters and digits (issue 38): kept as written, lower-cased, NFC
        ("Здоровье", "здоровье"),
        ("日記", "日記"),
        ("日本語", "日本語"),
        ("مذكرات يومية", "مذكرات-يومية"),
        ("हिन्दी नोट्स", "हिन्दी-नोट्स"),  # vowel signs and virama (combining marks) kept
        ("Ελληνικά ΣΗΜΕΙΩΣΕΙΣ", "ελληνικά-σημειωσεισ"),
        ("٣ أيام", "٣-أيام"),  # Arabic-Indic digit
        ("Notes Здоровье", "notes-здоровье"),
        ("🙂 ✓ →", ""),
        ("a\u200db", "ab"),  # a format character is dropped
    ],
)
def test_slugify(given: str, slug: str) -> None:
    assert names.slugify(given) == slug


def test_page_files_and_the_reserved_index() -> None:
    assert names.page_file("Notes.md") == "notes.md"
    assert names.page_file("my notes") == "my-notes.md"
    for index in ("MEMORY.md", "memory", " Memory.MD "):
        assert names.is_index(index)
        with pytest.raises(InvalidRequest, match="index"):
            names.page_file(index)
    with pytest.raises(InvalidRequest, match="no file name"):
        names.page_file("🙂")
    assert names.page_file("日記") == "日記.md"
    assert names.page_file("日記.md") == "日記.md"
    assert names.page_file("Здоровье") == "здоровье.md"


@pytest.mark.parametrize(
    "page",
    [
        "../../etc/passwd",
        "..",
        "a/b",
        "a\\b",
        "x\x00y",
        "x\ny",
        "日記/../MEMORY",
        "Здоровье\x1b[31m",
        "C:\\x",
    ],
)
def test_path_rules_stay_strict_in_every_script(page: str) -> None:
    """No slug can hold a separator, a dot, a control character or white space, whatever the
    script; the index's name stays refused in any form."""
    try:
        file = names.page_file(page)
    except InvalidRequest:
        return
    stem = file.removesuffix(".md")
    assert "." not in stem and "/" not in stem and "\\" not in stem, file
    assert all(ch.isprintable() and not ch.isspace() for ch in stem), file
    assert stem.lower() != "memory"


def test_the_index_name_is_refused_in_any_form() -> None:
    for index in ("ＭＥＭＯＲＹ", "memory.md", " MEMORY "):
        with pytest.raises(InvalidRequest, match="index"):
            names.page_file(index)


def test_names_in_any_script_are_valid_and_kept_as_written() -> None:
    for text in ("Здоровье", "日記", "مذكرات", "हिन्दी", "한국어 노트", "ภาษาไทย"):
        assert names.name(f"  {text} ", "project name") == text
    with pytest.raises(InvalidRequest, match="holds no letter or digit"):
        names.name("🙂 !!", "project name")
    with pytest.raises(InvalidRequest, match="control character"):
        names.name("bad\x07name", "project name")


def test_project_ids_stay_ascii_and_latin_ones_are_as_before() -> None:
    assert names.project_id_base("Garden") == "garden"
    assert names.project_id_base("Café été") == "cafe-ete"
    assert names.project_id_base("Notes Здоровье") == "notes"  # as it was derived before
    pid = names.project_id_base("Здоровье")
    assert names.is_slug(pid) and pid.startswith("p-") and len(pid) == 10
    assert pid == names.project_id_base("Здоровье") != names.project_id_base("日記")


def test_legacy_names_are_found_again() -> None:
    assert names.legacy_page_file("Notes Здоровье") == "notes.md"
    assert names.legacy_page_file("Diet notes") is None  # the same as before
    assert names.legacy_page_file("日記") is None  # was never accepted
    assert names.legacy_tracker_slug("Вес weight") == "weight"
    assert names.legacy_tracker_slug("weight") is None


def test_dates_periods_and_values() -> None:
    assert names.date(None, today=dt.date(2026, 3, 14)) == "2026-03-14"
    assert names.date(" 2024-02-29 ") == "2024-02-29"
    for bad in ("2023-02-29", "2026-3-14", "14/03/2026", ""):
        with pytest.raises(InvalidRequest, match="YYYY-MM-DD"):
            names.date(bad)
    assert names.period("events", "2026-01-05") == "2026-01-05"
    with pytest.raises(InvalidRequest, match="YYYY-MM"):
        names.period("month", "2026-13")
    with pytest.raises(InvalidRequest, match="finite"):
        names.value(float("nan"))
    assert [names.format_value(v) for v in (70.0, 70.5, -3.0, 0.1 + 0.2, 1e20)] == [
        "70",
        "70.5",
        "-3",
        "0.30000000000000004",
        "1e+20",
    ]
