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
        ("日本語", ""),
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
        names.page_file("日本語")


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
