"""The mutation job's own logic (``bench/mutation_bench.py``), without running a mutant: the
scope of each target exists, the operators are cosmic-ray's, a sample grows by extension,
the survivor share leaves equivalent mutants out, and a killed run's module is put back."""

from __future__ import annotations

from pathlib import Path

import pytest
from cosmic_ray.plugins import operator_names

from bench import _common
from bench import mutation_bench as mb


def test_every_target_names_code_and_tests_that_exist() -> None:
    names = set(operator_names())
    assert set(mb.OPERATORS) <= names
    for target in mb.TARGETS:
        source = (_common.REPO_ROOT / target.path).read_text()
        ranges = mb.scope_ranges(source, target.scope)  # raises for a name not defined
        assert all(a <= b for _, a, b in ranges)
        for arg in target.tests:
            if arg.endswith(".py"):
                assert (_common.REPO_ROOT / arg).exists(), arg
        assert mb.mutants(target), target.name


def test_scope_is_the_named_functions_lines() -> None:
    source = "def a():\n    return 1 == 2\n\n\nclass B:\n    def c(self):\n        return 3 < 4\n"
    assert mb.scope_ranges(source, ("B.c",)) == [("B.c", 6, 7)]
    assert mb.scope_ranges(source, ()) == [("<module>", 1, 7)]
    assert mb.enclosing(source, 7) == "B.c" and mb.enclosing(source, 2) == "a"
    with pytest.raises(LookupError):
        mb.scope_ranges(source, ("B.d",))


def test_a_larger_sample_extends_a_smaller_one() -> None:
    found = [{"operator": f"core/Op{i % 3}", "occurrence": i} for i in range(50)]
    small, large = mb.sample(found, 10), mb.sample(found, 25)
    assert len(small) == 10 and len(large) == 25
    assert all(m in large for m in small)
    assert mb.sample(found, 0) == found and mb.sample(found, 60) == found
    assert large == [m for m in found if m in large]  # source order kept


def test_the_share_leaves_equivalent_mutants_out(monkeypatch: pytest.MonkeyPatch) -> None:
    target = mb.TARGETS[0]

    def mutant(line: int, status: str) -> dict:
        return {"operator": "core/X", "occurrence": line, "line": line, "where": "f"}, status

    entries = [
        {**m, "code": f"line {m['line']}", "status": st}
        for m, st in (
            mutant(1, "killed"),
            mutant(2, "timeout"),
            mutant(3, "survived"),
            mutant(4, "survived"),
            mutant(5, "incompetent"),
        )
    ]
    monkeypatch.setitem(mb.EQUIVALENT, target.name, {"f: X: line 4": "same either way"})
    s = mb.summarise(target, {"mutants": entries, "in_scope": 9})
    assert (s["killed"], s["survived"], s["equivalent"], s["incompetent"]) == (2, 1, 1, 1)
    assert s["share"] == pytest.approx(1 / 3)  # 5 run − 1 equivalent − 1 incompetent
    assert s["survivors"] == ["f: X: line 3"] and s["in_scope"] == 9
    assert mb.summarise(target, None)["status"] == "not run"


def test_a_module_left_mutated_is_put_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / "rules.py"
    module.write_text("x = 1 != 2\n")
    target = mb.Target("t", "rules.py", (), (), "")
    monkeypatch.setattr(mb, "TARGETS", (target,))
    monkeypatch.setattr(mb, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(_common, "REPO_ROOT", tmp_path)
    (tmp_path / "cache").mkdir()
    mb._backup_path(target).write_text("x = 1 != 2\n")
    module.write_text("x = 1 == 2\n")  # a run killed with this mutant on disk
    assert mb.restore_leftovers() == ["rules.py"]
    assert module.read_text() == "x = 1 != 2\n" and not mb._backup_path(target).exists()
