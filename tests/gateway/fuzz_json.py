"""Bodies for the JSON-route fuzz (issue 38): every route of the gateway's OpenAPI that takes
a JSON body gets bodies shaped by its schema whose strings are drawn from what the world
sends: text outside the BMP, lone UTF-16 surrogates (written as ``\\uXXXX`` escapes, the
only way JSON can carry them), NUL, control characters and huge strings.

:func:`json_routes` lists the routes, :func:`bodies` is the hypothesis strategy of one
route's raw bodies, :func:`run_fuzz` sends them and collects every answer of 500 or more.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

NON_BMP = st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF, exclude_categories=["Cs"])
SURROGATE = st.characters(categories=["Cs"])
CONTROL = st.sampled_from(["\x00", "\x01", "\x1b", "\u2028", "\ufeff", "\ufffe"])
NASTY_CHAR = st.one_of(NON_BMP, SURROGATE, CONTROL, st.characters(max_codepoint=0xFFFF))

#: A string as the world sends it: short mixes of the above, or one huge string.
NASTY = st.one_of(
    st.text(NASTY_CHAR, min_size=1, max_size=24),
    st.sampled_from(["a \ud83d b", "\udc00", "\x00", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🌍", "Здоровье 日記"]),
    st.tuples(st.sampled_from(["x", "🌍", "\x00"]), st.integers(20_000, 200_000)).map(
        lambda t: t[0] * t[1]
    ),
)


def _resolve(schema: Any, spec: dict[str, Any]) -> dict[str, Any]:
    while isinstance(schema, dict) and "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = spec["components"]["schemas"][name]
    return schema if isinstance(schema, dict) else {}


def _types(schema: dict[str, Any], spec: dict[str, Any]) -> list[dict[str, Any]]:
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return [s for option in schema[key] for s in _types(_resolve(option, spec), spec)]
    kind = schema.get("type")
    if isinstance(kind, list):
        return [{**schema, "type": k} for k in kind]
    return [schema]


def value(schema: Any, spec: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values for ``schema``: every string a nasty one; numbers and booleans in range."""
    options = [s for s in _types(_resolve(schema, spec), spec) if s.get("type") != "null"]
    if not options:
        return NASTY
    strategies = []
    for option in options:
        kind = option.get("type")
        if kind == "string" or (kind is None and "properties" not in option):
            strategies.append(NASTY)
        elif kind == "integer":
            low = int(option.get("minimum", 1))
            strategies.append(st.integers(low, int(option.get("maximum", low + 10))))
        elif kind == "number":
            strategies.append(st.floats(0, 100, allow_nan=False))
        elif kind == "boolean":
            strategies.append(st.booleans())
        elif kind == "array":
            item = value(option.get("items", {}), spec, depth + 1) if depth < 4 else NASTY
            strategies.append(st.lists(item, min_size=1, max_size=2))
        else:
            strategies.append(obj(option, spec, depth + 1))
    return st.one_of(strategies)


def obj(schema: dict[str, Any], spec: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Objects with every required property and some optional ones (plus a stray key)."""
    schema = _resolve(schema, spec)
    props = schema.get("properties") or {}
    if depth > 4 or not props:
        return st.dictionaries(NASTY, NASTY, max_size=2)
    required = set(schema.get("required") or [])
    fields = {
        name: (value(sub, spec, depth) if name in required else st.none() | value(sub, spec, depth))
        for name, sub in props.items()
    }
    return st.fixed_dictionaries(fields).map(
        lambda d: {k: v for k, v in d.items() if v is not None or k in required}
    )


def json_routes(spec: dict[str, Any], prefix: str = r"^/(api|v1)") -> list[tuple[str, str, Any]]:
    """``(method, path, body schema)`` of every route under ``prefix`` with a JSON body."""
    out = []
    for path, ops in spec["paths"].items():
        if not re.match(prefix, path):
            continue
        for method, op in ops.items():
            content = (op.get("requestBody") or {}).get("content", {})
            if "application/json" in content:
                out.append((method.upper(), path, content["application/json"].get("schema", {})))
    return out


def bodies(
    schema: Any, spec: dict[str, Any], fixed: dict[str, Any] | None = None
) -> st.SearchStrategy[bytes]:
    """Raw bodies for one route: JSON with ``\\uXXXX`` escapes (so surrogates travel);
    ``fixed`` fields are set as given in every object body."""

    def encode(v: Any) -> bytes:
        if isinstance(v, dict) and fixed:
            v = {**v, **fixed}
        return json.dumps(v, ensure_ascii=True).encode()

    return value(schema, spec).map(encode)


def _calling(send: Any) -> Any:
    def test(body: bytes) -> None:
        send(body)

    return test


def run_fuzz(
    client: httpx.Client,
    spec: dict[str, Any],
    path_values: dict[str, str],
    examples: int,
    prefix: str = r"^/(api|v1)",
    skip: tuple[str, ...] = (),
    fixed: dict[str, dict[str, Any]] | None = None,
    last: tuple[str, ...] = (),
    allowed: dict[str, int] | None = None,
) -> tuple[int, list[str]]:
    """Send ``examples`` generated bodies to every JSON route (path parameters from
    ``path_values``, else ``x1``; ``fixed[path]``: fields set in every body; ``last``:
    routes fuzzed after all others; ``allowed[path]``: one documented 5xx status, e.g. 501
    for a feature the engine was not started with); returns (requests sent, the answers of 500 or more,
    each described)."""
    failures: list[str] = []
    sent = 0
    routes = sorted(json_routes(spec, prefix), key=lambda r: r[1] in last)
    for method, path, schema in routes:
        if path in skip:
            continue
        url = re.sub(r"\{([^}:]+)(:[^}]*)?\}", lambda m: path_values.get(m.group(1), "x1"), path)

        ok = (allowed or {}).get(path)

        def send(body: bytes, method: str = method, url: str = url, ok: int | None = ok) -> None:
            nonlocal sent
            sent += 1
            try:
                r = client.request(
                    method, url, content=body, headers={"content-type": "application/json"}
                )
            except httpx.HTTPError as exc:  # the gateway dropped the connection: a failure too
                failures.append(f"{method} {url} {type(exc).__name__} <- {body[:200]!r}")
                return
            if r.status_code >= 500 and r.status_code != ok:
                failures.append(f"{method} {url} {r.status_code} {r.text[:300]} <- {body[:200]!r}")

        one = settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )(given(body=bodies(schema, spec, (fixed or {}).get(path)))(_calling(send)))
        one()
    return sent, failures
