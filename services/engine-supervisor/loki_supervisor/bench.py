"""The engine benchmark: prompt processing and generation speed at several context depths,
measured through llama-server itself (pure measuring; the job, its lease and its storage are
:mod:`loki_supervisor.bench_job` and :mod:`loki_supervisor.bench_store`).

Like llama-bench's ``pp N @ d D`` and ``tg N @ d D``, but through the server a person runs, so
what is measured includes the server's batching, slots and prompt cache:

- a *depth* prompt of ``D`` tokens is sent first (``n_predict`` 1: a prefill; cached);
- ``pp``: the same ``D`` tokens plus ``N`` new ones (``n_predict`` 1); llama-server reuses the
  cached ``D`` and prefills the ``N``: ``timings.prompt_n`` is ``N`` and
  ``timings.prompt_per_second`` the pp speed at depth ``D``;
- ``tg``: the depth prompt again (cached) plus one fresh token, with ``n_predict`` ``N`` and
  ``ignore_eos``: ``timings.predicted_per_second`` is the tg speed at depth ``D``.

Prompts are lists of token ids (llama-server's ``/completion`` accepts them), so depths are
exact; each repetition's ``N`` new tokens differ (nothing of them is cached). Token ids are
drawn from a fixed seed in ``[TOKEN_LOW, TOKEN_HIGH)`` below the vocabulary size, as
llama-bench draws random tokens. Every request carries the lease's ``id_slot`` (None: not
set) and ``cache_prompt``.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from loki_shared.messages.engine import BenchPoint

#: Token ids used in the prompts (above the special tokens of common vocabularies).
TOKEN_LOW = 1000
TOKEN_HIGH = 20000
#: Seconds one benchmark request may take.
REQUEST_TIMEOUT_S = 300.0

#: One request's body -> its JSON answer (the caller holds the lease around it).
Send = Callable[[dict], Awaitable[dict]]
#: Progress: (steps done, steps planned, what runs now).
Progress = Callable[[int, int, str], None]


class BenchError(Exception):
    """A benchmark request failed or its answer lacks the timings measured."""


@dataclass(frozen=True)
class BenchPlan:
    """What one benchmark measures: ``depths`` (tokens), ``n_pp``/``n_tg`` (tokens per test),
    ``reps`` (repetitions of each point).

    Raises:
        ValueError: a depth below 0, ``n_pp``/``n_tg``/``reps`` below 1, or a point that does
            not fit ``n_ctx`` (``depth + max(n_pp, n_tg) + 1`` tokens).
    """

    depths: tuple[int, ...] = (0, 512, 2048)
    n_pp: int = 128
    n_tg: int = 32
    reps: int = 3

    def check(self, n_ctx: int, vocab: int | None = None) -> None:
        """Raise ValueError when the plan is malformed or a point exceeds ``n_ctx``."""
        if not self.depths or any(d < 0 for d in self.depths):
            raise ValueError("depths: one or more token counts ≥ 0")
        if self.n_pp < 1 or self.n_tg < 1 or self.reps < 1:
            raise ValueError("n_pp, n_tg and reps must be at least 1")
        if self.reps > 20 or len(self.depths) > 8:
            raise ValueError("at most 8 depths and 20 repetitions")
        need = max(self.depths) + max(self.n_pp, self.n_tg) + 1
        if n_ctx and need > n_ctx:
            raise ValueError(
                f"depth {max(self.depths)} + {max(self.n_pp, self.n_tg)} tokens exceeds the "
                f"slot's window of {n_ctx} tokens"
            )

    @property
    def steps(self) -> int:
        """Requests measured (progress total): two tests per depth and repetition."""
        return len(self.depths) * self.reps * 2


def spread(values: list[float]) -> tuple[float | None, float | None, float | None]:
    """``(median, low, high)`` of ``values`` (Nones when empty)."""
    if not values:
        return None, None, None
    return statistics.median(values), min(values), max(values)


def _tokens(rng: random.Random, n: int, high: int) -> list[int]:
    return [rng.randrange(TOKEN_LOW, high) for _ in range(n)]


def _timing(answer: dict, key: str) -> float:
    timings = answer.get("timings") or {}
    value = timings.get(key)
    if not isinstance(value, (int, float)) or value <= 0:
        raise BenchError(f"the engine's answer has no timings.{key}")
    return float(value)


async def measure(
    send: Send,
    plan: BenchPlan,
    id_slot: int | None,
    progress: Progress | None = None,
    vocab: int | None = None,
    seed: int = 46,
) -> list[BenchPoint]:
    """Measure ``plan`` through ``send`` (one ``/completion`` request per call).

    Returns one ``pp`` and one ``tg`` :class:`BenchPoint` per depth (in ``plan.depths``
    order), each with ``plan.reps`` speeds and their median and spread.

    Raises:
        BenchError: a request failed or answered without timings.
    """
    rng = random.Random(seed)
    high = min(TOKEN_HIGH, vocab) if vocab and vocab > TOKEN_LOW + 100 else TOKEN_HIGH
    done = 0
    points: list[BenchPoint] = []

    def body(prompt: list[int], n_predict: int) -> dict:
        out: dict = {
            "prompt": prompt,
            "n_predict": n_predict,
            "cache_prompt": True,
            "temperature": 0,
            "ignore_eos": True,
        }
        if id_slot is not None:
            out["id_slot"] = id_slot
        return out

    for depth in plan.depths:
        base = _tokens(rng, depth, high)
        if depth:
            await send(body(base, 1))  # the depth, prefilled and cached
        pp: list[float] = []
        tg: list[float] = []
        for rep in range(plan.reps):
            if progress:
                progress(done, plan.steps, f"pp {plan.n_pp} @ depth {depth} ({rep + 1})")
            answer = await send(body(base + _tokens(rng, plan.n_pp, high), 1))
            pp.append(_timing(answer, "prompt_per_second"))
            done += 1
            if progress:
                progress(done, plan.steps, f"tg {plan.n_tg} @ depth {depth} ({rep + 1})")
            # the depth prompt plus one fresh token: the depth is cached, generation measured
            answer = await send(body(base + _tokens(rng, 1, high), plan.n_tg))
            tg.append(_timing(answer, "predicted_per_second"))
            done += 1
        for test, n, values in (("pp", plan.n_pp, pp), ("tg", plan.n_tg, tg)):
            med, low, hi = spread(values)
            points.append(
                BenchPoint(
                    test=test,  # type: ignore[arg-type]
                    depth=depth,
                    n=n,
                    tps=[round(v, 3) for v in values],
                    median=med,
                    low=low,
                    high=hi,
                )
            )
    if progress:
        progress(done, plan.steps, "done")
    return points


def http_sender(http: httpx.AsyncClient, base_url: str, api_key: str | None) -> Send:
    """A :data:`Send` posting to ``{base_url}/completion`` (bearer ``api_key`` when set).

    The returned function raises :class:`BenchError` on a transport error or a non-2xx
    answer (with the engine's message)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def send(body: dict) -> dict:
        try:
            r = await http.post(
                f"{base_url}/completion", json=body, headers=headers, timeout=REQUEST_TIMEOUT_S
            )
        except httpx.HTTPError as exc:
            raise BenchError(f"benchmark request failed: {type(exc).__name__}: {exc}") from exc
        if r.status_code >= 300:
            raise BenchError(f"the engine answered {r.status_code}: {r.text[:300]}")
        data = r.json()
        if not isinstance(data, dict):
            raise BenchError("the engine's answer is not a JSON object")
        return data

    return send


def summary(points: list[BenchPoint]) -> tuple[float | None, float | None]:
    """The median pp and tg speeds over a run's points (tokens per second)."""
    pp = [p.median for p in points if p.test == "pp" and p.median is not None]
    tg = [p.median for p in points if p.test == "tg" and p.median is not None]
    return (
        statistics.median(pp) if pp else None,
        statistics.median(tg) if tg else None,
    )
