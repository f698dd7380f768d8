"""Mutation testing of the rule modules (issue 39): cosmic-ray's mutations, one at a time, on
the code that carries docs/behaviour.md's rules, each run against the tests those rules name.

Each target below is a module of rules and, where only part of the module is rule code, the
functions (``Class.method`` or a module-level name) whose lines are mutated; its ``tests`` are
the fast tests docs/behaviour.md names for those rules (scripted fake engine, real NATS/Redis
fixtures; never the real engine, so a mutant runs in seconds). Per mutant: cosmic-ray writes
the mutated module on disk (:func:`cosmic_ray.mutating.use_mutation`: one operator at one
occurrence) and puts it back afterwards; meanwhile ``pytest -x`` runs the target's tests in a
child forked from a process that has already imported their third-party dependencies (the
repository's own modules are imported afresh in the child), which saves the few seconds of
imports a new interpreter would cost per mutant on a shared two-core machine. The operators
are the ones that break a rule's clause: a comparison negated or moved across its boundary
(``==``/``!=``, ``<``/``<=``/``>=``, ``is``/``is not``), ``and``/``or`` swapped, a ``not``
removed from a condition, ``True``/``False`` swapped, ``+``/``-`` swapped, a loop
run zero times, ``break``/``continue`` swapped (:data:`OPERATORS`).

A mutant is ``killed`` when the tests fail (or run past the target's time limit, as
cosmic-ray counts it), ``survived`` when they pass. A survivor is either killed by a new test
or listed in :data:`EQUIVALENT` with the reason no test can tell it apart (the same behaviour
by another path); the report's survivor share leaves the equivalent ones out:
share = survivors not equivalent / (mutants − equivalent). Target: ≤ 10% per module.

Results are cached per target in ``bench/results/.mutation/<name>.json`` under a hash of the
module, the test files and the settings, so a run re-tests only the targets whose code or
tests changed (``LOKI_MUTATION_ONLY=name,name`` runs only those; the others come from the
cache or are reported as not run). The module is restored even if the run is killed: a copy
is kept beside the cache while it is mutated and put back at the next start.

Runs ``make mutation`` or ``python -m bench --only mutation``; loopback only; CPU bound
(one pytest process at a time).
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import hashlib
import json
import os
import shlex
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import _common

TIMEOUT_S = {"quick": 7200, "full": 14400}
CACHE_DIR = _common.RESULTS_DIR / ".mutation"
#: Survivor share a module may keep (non-equivalent survivors / non-equivalent mutants).
TARGET_SHARE = 0.10

_CMP = ("Eq_NotEq", "NotEq_Eq", "Lt_LtE", "LtE_Lt", "Gt_GtE", "GtE_Gt")
_CMP += ("Lt_GtE", "GtE_Lt", "LtE_Gt", "Gt_LtE", "Is_IsNot", "IsNot_Is")
#: cosmic-ray operators used (``cosmic-ray operators`` lists them all; the rest — every
#: arithmetic pair, number offsets, exception and decorator removal, and ``AddNot``, which
#: negates every condition and would double the run — mostly change what a rule computes
#: rather than which of its clauses applies).
OPERATORS: tuple[str, ...] = (
    *(f"core/ReplaceComparisonOperator_{pair}" for pair in _CMP),
    "core/ReplaceAndWithOr",
    "core/ReplaceOrWithAnd",
    "core/ReplaceUnaryOperator_Delete_Not",
    "core/ReplaceTrueWithFalse",
    "core/ReplaceFalseWithTrue",
    "core/ReplaceBinaryOperator_Add_Sub",
    "core/ReplaceBinaryOperator_Sub_Add",
    "core/ZeroIterationForLoop",
    "core/ReplaceBreakWithContinue",
    "core/ReplaceContinueWithBreak",
)


@dataclass(frozen=True)
class Target:
    """One module of rules: ``path`` (from the repository root), ``scope`` (qualified names
    of the functions mutated; empty: the whole module), ``tests`` (pytest arguments: files,
    node ids, ``-k`` expressions)."""

    name: str
    path: str
    scope: tuple[str, ...]
    tests: tuple[str, ...]
    rules: str


CHAT = "services/chat/loki_chat"
SUP = "services/engine-supervisor/loki_supervisor"

TARGETS: tuple[Target, ...] = (
    Target(
        "compaction rules",
        f"{CHAT}/compaction/rules.py",
        (),
        ("tests/compaction/test_compaction_rules.py",),
        "compaction: what a summary keeps, the tail, the budget",
    ),
    Target(
        "compaction decide",
        f"{CHAT}/compaction/decide.py",
        (),
        ("tests/compaction/test_compaction_decide.py",),
        "compaction: when and where to cut, continuation or transcript",
    ),
    Target(
        "turn loop (rule parts)",
        f"{CHAT}/step_rules.py",
        (),
        (
            "tests/chat/test_chat_verify.py",
            "tests/templates/test_template_chat.py",
            "tests/chat/test_chat_see_image.py",
            "tests/chat/test_chat_subagent.py",
            "-k",
            "not real_engine and not engine",
        ),
        "verifier, tools withheld, REASONING_ECHO, NUDGE_IN_TOOL, unstable prefix",
    ),
    Target(
        "kept images",
        f"{CHAT}/kept_images.py",
        (),
        (
            "tests/chat/test_chat_kept_images.py",
            "tests/compaction/test_compaction_kept_images.py",
        ),
        "KEEP_TURN_IMAGES",
    ),
    Target(
        "tasks schedule",
        f"{CHAT}/tasks/schedule.py",
        (),
        ("tests/chat/test_task_schedule.py",),
        "scheduled tasks: due times, validation",
    ),
    Target(
        "tasks scheduler",
        f"{CHAT}/tasks/scheduler.py",
        ("Scheduler.tick_task", "Scheduler._run", "outcome"),
        (
            "tests/chat/test_task_schedule.py",
            "tests/chat/test_tasks.py",
            "-k",
            "missed or outage or persons_turn or outcome",
        ),
        "scheduled tasks: grace, waiting for the person's turn (the orphaned runs' recovery "
        "is left out: its test kills a process and takes a minute)",
    ),
    Target(
        "prewarm",
        f"{CHAT}/prewarm.py",
        (),
        ("tests/compaction/test_prewarm.py", "tests/engine/test_prewarm_lease.py"),
        "PREWARM",
    ),
    Target(
        "slot persistence",
        f"{SUP}/slot_persist.py",
        (),
        ("tests/engine/test_slot_persister.py",),
        "SLOT_PERSIST",
    ),
    Target(
        "template probe",
        f"{SUP}/probe.py",
        (),
        ("tests/templates/test_probe.py",),
        "the template probe's verdicts",
    ),
    Target(
        "tokens",
        f"{CHAT}/tokens.py",
        (),
        ("tests/chat/test_chat_token_counts.py",),
        "exact token counts",
    ),
    Target(
        "permissions",
        "shared/loki_shared/permissions.py",
        (),
        ("tests/shared/test_permissions.py",),
        "credentials on the bus and the store",
    ),
    Target(
        "recall delete",
        "services/recall/loki_recall/owners.py",
        (),
        ("tests/recall/test_scope_and_delete.py",),
        "deleting a conversation's or project's blocks",
    ),
    Target(
        "lease",
        f"{SUP}/lease_book.py",
        (),
        ("tests/engine/test_lease.py", "tests/engine/test_prewarm_lease.py"),
        "the supervisor's leases: FIFO per slot, pre-emption, expiry",
    ),
)

#: Survivors no test can tell apart from the code, by target name and the mutant's
#: signature (``Class.method: operator: the original line``): why each is equivalent.
EQUIVALENT: dict[str, dict[str, str]] = {
    "compaction decide": {
        "lookahead_tokens: ReplaceComparisonOperator_LtE_Lt: if n_ctx <= 0:": (
            "a shortcut: with a window of 0 the result is capped at LOOKAHEAD_SHARE × 0 = 0 anyway"
        ),
    },
    "tasks schedule": {
        "due_times: ReplaceComparisonOperator_LtE_Lt: if now <= after:": (
            "a shortcut for an empty span: with now equal to the start the rest gives no due "
            "time either (interval: the first index is past the last; cron: the next time is "
            "after now)"
        ),
    },
    "recall delete": {
        "Owners.complete: ReplaceTrueWithFalse: return True": (
            "the value of complete(True) is never read: its one caller (the archive's start-up "
            "completion of the owner sets) only records that they are complete"
        ),
        "Owners.add: ReplaceFalseWithTrue: async with self.redis.pipeline(transaction=False) "
        "as pipe:": (
            "the same idempotent SADDs in one round trip, wrapped in MULTI/EXEC or not: the "
            "sets end the same, and add() runs once at start-up before recall serves"
        ),
        "Owners.record: ReplaceTrueWithFalse: async with self.redis.pipeline(transaction=True) "
        "as pipe:": (
            "the two SADDs of one deletion go in one round trip with or without MULTI/EXEC; "
            "only a reader between the two replies could tell, which no deterministic test "
            "can place (Redis runs a pipeline's commands back to back)"
        ),
    },
    "tasks scheduler": {
        "Scheduler._run: ReplaceComparisonOperator_Gt_GtE: if time.monotonic() > wait_until:": (
            "the boundary is a monotonic clock reading equal, to the last bit, to the end of "
            "the wait; the loop looks every 0.25 s and never lands exactly on it"
        ),
    },
    "prewarm": {
        "PrewarmJob: ReplaceFalseWithTrue: echo: bool = False": (
            "a default no caller uses: both places that build a PrewarmJob (the turn's end "
            "and the actor's slot owner) pass the turn's own REASONING_ECHO verdict"
        ),
    },
    "tokens": {
        "_texts: ReplaceTrueWithFalse: message = message.model_dump(exclude_none=True, "
        'exclude={"loki", "reasoning_model"})': (
            "a None field kept or left out reads the same: content and tool_calls are read "
            "with `or` fallbacks, nothing else of the dump is used"
        ),
        "TokenCounts._engine: ReplaceComparisonOperator_GtE_Gt: if not self._known and "
        "self.locate is not None and now >= self._locate_after:": (
            "the boundary is a monotonic clock reading equal, to the last bit, to the time "
            "the next look-up is allowed: the first look is at 0.0 (any reading passes "
            "either way), later ones never land exactly on it"
        ),
    },
    "lease": {
        "LeaseManager.expire: ReplaceComparisonOperator_Gt_GtE: gone += [h for h in "
        "self.held.values() if h.holder in dead and h.deadline > now]": (
            "a lease whose deadline is exactly now is in `gone` already (deadline <= now); "
            "the boundary is a monotonic reading equal to a deadline to the last bit"
        ),
        "LeaseManager._drop: ReplaceUnaryOperator_Delete_Not: elif not waiter.future.done():": (
            "the waiter has just left the queue and only its own acquire() held its future, "
            "which returns or raises right after: cancelling that future or not changes "
            "nothing anyone can see"
        ),
        "LeaseManager.pump: ReplaceContinueWithBreak: continue": (
            "the branch of a finished waiter still queued: no path leaves one there (a "
            "cancelled or timed-out acquire() removes its waiter in _drop, expire() and "
            "close() remove theirs as they fail them), so the loop never takes it"
        ),
    },
}


# --------------------------------------------------------------------------- the mutants
def scope_ranges(source: str, scope: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """``(qualified name, first line, last line)`` of each function of ``scope`` in
    ``source`` (the whole module as ``<module>`` when ``scope`` is empty).

    Raises:
        LookupError: a name of ``scope`` is not defined in ``source``.
    """
    tree = ast.parse(source)
    found: dict[str, tuple[int, int]] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                found[name] = (child.lineno, child.end_lineno or child.lineno)
                walk(child, f"{name}.")

    walk(tree, "")
    if not scope:
        return [("<module>", 1, len(source.splitlines()))]
    missing = [n for n in scope if n not in found]
    if missing:
        raise LookupError(f"not defined: {', '.join(missing)}")
    return [(n, *found[n]) for n in scope]


def enclosing(source: str, line: int) -> str:
    """The qualified name of the innermost function or class holding ``line``."""
    tree = ast.parse(source)
    best = "<module>"

    def walk(node: ast.AST, prefix: str) -> None:
        nonlocal best
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                end = child.end_lineno or child.lineno
                if child.lineno <= line <= end:
                    best = f"{prefix}{child.name}"
                    walk(child, f"{best}.")

    walk(tree, "")
    return best


def mutants(target: Target) -> list[dict[str, Any]]:
    """The mutations of ``target``: ``{"operator", "occurrence", "line", "where", "code"}``
    for every position of every operator of :data:`OPERATORS` within the target's scope."""
    from cosmic_ray.ast import ast_nodes, get_ast_from_path
    from cosmic_ray.plugins import get_operator

    path = _common.REPO_ROOT / target.path
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    ranges = scope_ranges(source, target.scope)
    module = get_ast_from_path(path)
    out: list[dict[str, Any]] = []
    seen: Counter[tuple[str, str, str]] = Counter()
    for name in OPERATORS:
        operator = get_operator(name)()
        positions = [p for node in ast_nodes(module) for p in operator.mutation_positions(node)]
        for occurrence, (start, end) in enumerate(positions):
            line = start[0]
            if not any(a <= line <= b for _, a, b in ranges):
                continue
            where, code = enclosing(source, line), lines[line - 1].strip()
            seen[(where, name, code)] += 1
            out.append(
                {
                    "operator": name,
                    "occurrence": occurrence,
                    "nth": seen[(where, name, code)],
                    "line": line,
                    "start": list(start),
                    "end": list(end),
                    "where": where,
                    "code": code,
                }
            )
    return out


def sample(found: list[dict[str, Any]], cap: int) -> list[dict[str, Any]]:
    """At most ``cap`` of ``found`` (0: all): the first in an order fixed by a hash of each
    mutant's operator and occurrence, so a larger cap extends a smaller one's choice (and
    reuses its outcomes); returned in source order."""
    if not cap or len(found) <= cap:
        return found

    def rank(m: dict[str, Any]) -> str:
        return hashlib.sha256(f"{m['operator']}:{m['occurrence']}".encode()).hexdigest()

    chosen = {id(m) for m in sorted(found, key=rank)[:cap]}
    return [m for m in found if id(m) in chosen]


def signature(m: dict[str, Any]) -> str:
    """A mutant's name that survives line moves: ``where: operator: code``, then ``#n``
    for the n-th (n > 1) of the same operator on the same code in the same function."""
    name = f"{m['where']}: {m['operator'].removeprefix('core/')}: {m['code']}"
    return name + (f" #{m['nth']}" if m.get("nth", 1) > 1 else "")


# --------------------------------------------------------------------------- running
PYTEST_ARGS = ("-x", "-q", "-p", "no:cacheprovider")


def test_command(target: Target) -> str:
    """The equivalent command line of what each mutant runs (for the report)."""
    return shlex.join(["python", "-m", "pytest", *PYTEST_ARGS, *target.tests])


def preload(target: Target) -> None:
    """Import what the target's tests import (pytest's collection, in this process), so that
    each forked mutant run re-imports only the repository's own modules."""
    import pytest

    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(1), os.dup(2)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *target.tests])
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(devnull)


def fresh(target: Target, name: str, file: str, root: str) -> bool:
    """Whether a mutant's child imports module ``name`` (``file``) afresh: every module of
    the repository, except the shared package's for a supervisor target (its message models
    cost the most to build again, and it never imports a supervisor module). A chat module
    needs the shared package afresh too: its settings class reuses the shared package's
    field definitions, which a second class cannot share."""
    if not file.startswith(root) or file.startswith(sys.prefix + os.sep):
        return False  # outside the repository, or in a virtual environment inside it
    keep_shared = target.path.startswith("services/engine-supervisor/")
    return not (keep_shared and name.startswith("loki_shared"))


def run_tests(target: Target, timeout: float) -> tuple[str, float]:
    """Run the target's tests in a forked child (its own session: whatever it starts dies
    with it); the repository's modules are dropped from the child's imports first, so it
    reads the module as it is on disk now (it writes no bytecode; a mutant's file carries a
    modification time of its own, so no cached bytecode ever stands for it).

    Returns:
        ``("survived" | "killed" | "timeout" | "incompetent", seconds)``: pytest's exit
        status 0, 1–3 (a failure, an interruption, an error while collecting), past
        ``timeout``, 4–5 (a usage error, no test collected).
    """
    root = str(_common.REPO_ROOT) + os.sep
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 3
        try:
            os.setsid()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            sys.dont_write_bytecode = True
            for name, module in list(sys.modules.items()):
                if fresh(target, name, getattr(module, "__file__", None) or "", root):
                    del sys.modules[name]
            import pytest

            code = int(pytest.main([*PYTEST_ARGS, *target.tests]))
        finally:
            os._exit(code)
    status = None
    while time.monotonic() - t0 < timeout:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(wait_status)
            status = "survived" if code == 0 else "incompetent" if code in (4, 5) else "killed"
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # past the limit, or servers a test left behind
    if status is None:
        os.waitpid(pid, 0)
        status = "timeout"  # counted as killed, as cosmic-ray counts it
    return status, time.monotonic() - t0


def code_key(target: Target) -> str:
    """Hash of the code a target mutates: its module and its scope."""
    h = hashlib.sha256(json.dumps(list(target.scope)).encode())
    h.update((_common.REPO_ROOT / target.path).read_bytes())
    return h.hexdigest()


def tests_key(target: Target) -> str:
    """Hash of the tests a target runs: the arguments, the test files and their conftest."""
    h = hashlib.sha256(json.dumps(list(target.tests)).encode())
    for name in sorted({t.split("::")[0] for t in target.tests if ".py" in t}):
        path = _common.REPO_ROOT / name
        for extra in (path, path.parent / "conftest.py"):
            if extra.exists():
                h.update(extra.read_bytes())
    return h.hexdigest()


def _cache_path(target: Target) -> Path:
    return CACHE_DIR / (target.name.replace(" ", "_").replace("(", "").replace(")", "") + ".json")


def _backup_path(target: Target) -> Path:
    return CACHE_DIR / (_cache_path(target).stem + ".original.py")


def restore_leftovers() -> list[str]:
    """Put back any module a killed run left mutated (its copy is kept while it runs)."""
    restored = []
    for target in TARGETS:
        backup = _backup_path(target)
        if backup.exists():
            (_common.REPO_ROOT / target.path).write_bytes(backup.read_bytes())
            backup.unlink()
            restored.append(target.path)
    return restored


def run_target(
    target: Target,
    previous: dict[str, Any] | None = None,
    cap: int = 0,
    save: Any = None,
    log: Any = sys.stderr,
) -> dict[str, Any]:
    """Run every mutant of ``target`` against its tests (cosmic-ray writes each mutant on
    disk and puts the module back); the raw outcome, as cached.

    ``cap``: at most that many mutants (:func:`sample`; 0: all). ``save``: called with the
    outcome so far after each mutant (a run stopped midway
    resumes there). ``previous``: the cached outcome. With the same code, a mutant it holds is not run
    again when it was killed (tests added since cannot let it live; a full run: delete the
    cache) or when the tests did not change either; so after a new test only the survivors
    run again.
    """
    from cosmic_ray.mutating import use_mutation
    from cosmic_ray.plugins import get_operator

    doc: dict[str, Any] = {
        "code": code_key(target),
        "tests": tests_key(target),
        "command": test_command(target),
        "cap": cap,
    }
    known: dict[tuple[str, int], dict[str, Any]] = {}
    if previous and previous.get("code") == doc["code"] and not previous.get("error"):
        same_tests = previous.get("tests") == doc["tests"]  # a partial run's too
        for m in previous.get("mutants", []):
            if same_tests or m["status"] in ("killed", "timeout"):
                known[(m["operator"], m["occurrence"])] = m
    path = _common.REPO_ROOT / target.path
    found = mutants(target)
    todo = sample(found, cap)
    doc["in_scope"] = len(found)
    if all((m["operator"], m["occurrence"]) in known for m in todo):
        doc.update(baseline_s=previous.get("baseline_s"), duration_s=0.0)  # type: ignore[union-attr]
        doc["mutants"] = [{**known[(m["operator"], m["occurrence"])], **m} for m in todo]
        return doc
    preload(target)
    baseline, baseline_s = run_tests(target, 900)
    if baseline != "survived":  # the tests fail on the code itself
        doc.update(error=f"the tests fail without a mutation ({baseline})")
        return doc
    timeout = max(15.0, 3 * baseline_s)
    backup = _backup_path(target)
    backup.parent.mkdir(parents=True, exist_ok=True)
    backup.write_bytes(path.read_bytes())
    original = path.read_text(encoding="utf-8")
    results = []
    t0 = time.monotonic()
    try:
        for i, m in enumerate(todo, 1):
            if (m["operator"], m["occurrence"]) in known:
                results.append({**known[(m["operator"], m["occurrence"])], **m})
                continue
            operator = get_operator(m["operator"])()
            with use_mutation(path, operator, m["occurrence"]) as (_, mutated):
                if mutated is None:
                    continue
                stamp = 1_000_000_000 + i  # 2001: never the time of a cached bytecode file
                os.utime(path, (stamp, stamp))
                status, seconds = run_tests(target, timeout)
            entry = {**m, "status": status, "seconds": round(seconds, 1)}
            if status not in ("killed", "timeout"):
                entry["diff"] = "".join(
                    difflib.unified_diff(original.splitlines(True), mutated.splitlines(True), n=0)
                )[-1500:]
            results.append(entry)
            if save is not None:
                save({**doc, "partial": True, "mutants": results})
            print(
                f"[mutation] {target.name} {i}/{len(todo)}: {status} {signature(m)}",
                file=log,
                flush=True,
            )
    finally:
        if path.read_bytes() != backup.read_bytes():
            path.write_bytes(backup.read_bytes())
        backup.unlink()
    doc.update(
        baseline_s=round(baseline_s, 1),
        duration_s=round(time.monotonic() - t0, 1),
        mutants=results,
    )
    return doc


def cached(target: Target) -> dict[str, Any] | None:
    """The cached outcome of ``target`` (whatever code and tests it was run on)."""
    path = _cache_path(target)
    return json.loads(path.read_text()) if path.exists() else None


def outcome_of(target: Target, cap: int = 0) -> dict[str, Any] | None:
    """The cached outcome of ``target`` when it was run on its code and tests as they are,
    with the same ``cap``."""
    doc = cached(target)
    if doc is None or doc.get("partial") or doc.get("cap", 0) != cap:
        return None
    if doc.get("code") != code_key(target) or doc.get("tests") != tests_key(target):
        return None
    return doc


def unfinished(target: Target) -> dict[str, Any] | None:
    """A run of ``target`` stopped midway (or run with another cap, or before its tests
    changed) on its code as it is: reported as such, never as a complete run."""
    doc = cached(target)
    if doc is None or doc.get("code") != code_key(target) or not doc.get("mutants"):
        return None
    return {**doc, "partial": True}


def summarise(target: Target, doc: dict[str, Any] | None) -> dict[str, Any]:
    """Counts of one target's outcome, with its survivors split by :data:`EQUIVALENT`."""
    if doc is None:
        return {"name": target.name, "status": "not run"}
    if doc.get("error"):
        return {"name": target.name, "status": "error", "error": doc["error"]}
    reasons = EQUIVALENT.get(target.name, {})
    counts = Counter(m["status"] for m in doc["mutants"])
    survivors = [m for m in doc["mutants"] if m["status"] == "survived"]
    equivalent = [m for m in survivors if signature(m) in reasons]
    live = [m for m in survivors if signature(m) not in reasons]
    judged = len(doc["mutants"]) - len(equivalent) - counts.get("incompetent", 0)
    share = len(live) / judged if judged else 0.0
    return {
        "name": target.name,
        "status": "partial" if doc.get("partial") else "ok",
        "mutants": len(doc["mutants"]),
        "in_scope": doc.get("in_scope", len(doc["mutants"])),
        "killed": counts.get("killed", 0) + counts.get("timeout", 0),
        "survived": len(live),
        "equivalent": len(equivalent),
        "incompetent": counts.get("incompetent", 0),
        "share": share,
        "survivors": [signature(m) for m in live],
        "equivalents": [(signature(m), reasons[signature(m)]) for m in equivalent],
        "duration_s": doc.get("duration_s"),
    }


def run(quick: bool = False) -> dict[str, Any]:
    """The bench: run the targets whose cached outcome is stale (``LOKI_MUTATION_ONLY``:
    only those named; ``LOKI_MUTATION_RUN=0``: none, the report from the cache), then report
    every target (``LOKI_MUTATION_MAX``: the cap; quick mode 15)."""
    restored = restore_leftovers()
    if restored:
        print(f"[mutation] restored a module left mutated: {restored}", file=sys.stderr)
    only = {n.strip() for n in os.environ.get("LOKI_MUTATION_ONLY", "").split(",") if n.strip()}
    cap = int(os.environ.get("LOKI_MUTATION_MAX") or (15 if quick else 0))
    run_any = os.environ.get("LOKI_MUTATION_RUN", "1") != "0"

    def stop(_sig: int, _frame: Any) -> None:
        raise SystemExit("stopped")  # unwinds through run_target: the module is put back

    signal.signal(signal.SIGTERM, stop)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    for target in TARGETS:
        if not run_any or (only and target.name not in only):
            continue
        if outcome_of(target, cap) is not None:
            continue
        path = _cache_path(target)
        doc = run_target(
            target,
            cached(target),
            cap,
            lambda d, p=path: p.write_text(json.dumps(d, indent=1) + "\n"),
        )
        _cache_path(target).write_text(json.dumps(doc, indent=1) + "\n")
    rows, survivors, targets = [], [], []
    summaries = [summarise(t, outcome_of(t, cap) or unfinished(t)) for t in TARGETS]
    for t, s in zip(TARGETS, summaries, strict=True):
        tests = ", ".join(f"`{a}`" for a in t.tests)
        if s["status"] not in ("ok", "partial"):
            rows.append([t.name, f"`{t.path}`", s["status"], "", "", "", "", "", tests])
            continue
        scope = "whole module" if not t.scope else ", ".join(f"`{n}`" for n in t.scope)
        rows.append(
            [
                t.name,
                f"`{t.path}` ({scope})",
                f"{s['mutants']} / {s['in_scope']}"
                + (" (stopped midway)" if s["status"] == "partial" else ""),
                s["killed"],
                s["survived"],
                s["equivalent"],
                s["incompetent"],
                round(100 * s["share"], 1),
                tests,
            ]
        )
        survivors += [[t.name, f"`{sig}`", "not killed yet"] for sig in s["survivors"]]
        survivors += [[t.name, f"`{sig}`", why] for sig, why in s["equivalents"]]
        targets.append(
            _common.target(
                f"surviving mutants, {t.name} (not equivalent)",
                round(100 * s["share"], 1),
                "<=",
                100 * TARGET_SHARE,
                "%",
                issue="39",
            )
        )
    done = [s for s in summaries if s["status"] in ("ok", "partial")]
    total = sum(s["mutants"] for s in done)
    seconds = sum(
        m.get("seconds") or 0.0
        for t in TARGETS
        for m in ((outcome_of(t, cap) or unfinished(t) or {}).get("mutants") or [])
    )
    live = sum(s["survived"] for s in done)
    tables = [
        _common.table(
            "Mutants per rule module",
            [
                "module",
                "code mutated",
                "mutants run / in scope",
                "killed",
                "survived",
                "equivalent",
                "incompetent",
                "survivors %",
                "tests run",
            ],
            rows,
            notes=(
                f"{len(done)} of {len(TARGETS)} modules run; {total} mutants, {live} surviving "
                "(not equivalent). survivors % = survived / (mutants run − equivalent − "
                "incompetent). A mutant whose tests ran past the time limit counts as killed. "
                + (
                    f"At most {cap} mutants a module (LOKI_MUTATION_MAX), chosen by a fixed "
                    "hash of operator and position: where fewer were run than are in scope, "
                    "the share is a sample's."
                    if cap
                    else "Every mutant in scope was run."
                )
                + f" The mutants' test runs took {seconds / 60:.0f} min in all on this "
                "machine (outcomes cached: a run re-tests only what changed)."
            ),
        ),
        _common.table(
            "Surviving mutants",
            ["module", "mutant (where: operator: original line)", "why it survives"],
            survivors or [["—", "none", ""]],
        ),
    ]
    return _common.result(
        "Mutation testing of the rule modules",
        tables=tables,
        targets=targets,
        data={"summaries": summaries, "operators": list(OPERATORS)},
        notes=(
            "cosmic-ray's operators that break a rule's clause (comparisons negated or moved "
            "across their boundary, and/or swapped, a not removed, True/False, +/−, "
            "a loop run zero times, break/continue), one mutant at a time, against the fast "
            "tests docs/behaviour.md names for each module's rules (scripted fake engine, real "
            "NATS and Redis). Method: `bench/mutation_bench.py`."
        ),
    )
