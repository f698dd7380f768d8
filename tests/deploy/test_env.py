"""Issue 9: ``.env.example`` agrees with the Settings classes, and every variable a service
reads is set by compose (or its image) or has a default."""

from __future__ import annotations

import importlib
import io
import re
import subprocess
import sys

import pytest
from dotenv import dotenv_values

from .compose_model import (
    BASE,
    LOKI_SERVICES,
    ROOT,
    UNRAID,
    env_of,
    image_for,
    render,
)

sys.path.insert(0, str(ROOT / "scripts"))
import gen_env_example

PACKAGES = sorted({pkg for _, pkg in LOKI_SERVICES.values()})


def settings_class(package: str) -> type:
    return importlib.import_module(f"{package}.settings").Settings


def example_values() -> dict[str, str]:
    """Every ``NAME=value`` of .env.example, commented or not, parsed as dotenv does."""
    lines = []
    for line in (ROOT / ".env.example").read_text().splitlines():
        m = re.match(r"^# ?([A-Z][A-Z0-9_]*=.*)$", line)
        if m:
            lines.append(m.group(1))
        elif re.match(r"^[A-Z][A-Z0-9_]*=", line):
            lines.append(line)
    return {k: (v or "") for k, v in dotenv_values(stream=io.StringIO("\n".join(lines))).items()}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for key in list(os.environ):
        if key.startswith("LOKI_"):
            monkeypatch.delenv(key)
    return monkeypatch


def test_env_example_is_up_to_date() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts/gen_env_example.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr


@pytest.mark.parametrize("package", PACKAGES)
def test_env_example_gives_every_setting_with_its_default(
    package: str, clean_env: pytest.MonkeyPatch
) -> None:
    """Setting a variable to the value .env.example shows yields the field's default."""
    values = example_values()
    cls = settings_class(package)
    for name, info in cls.model_fields.items():
        env = f"LOKI_{name.upper()}"
        assert env in values, f"{env} ({package}) missing from .env.example"
        default = info.get_default(call_default_factory=True)
        if values[env] == "":
            clean_env.delenv(env, raising=False)
            if default is not None and default != "":
                pytest.fail(f"{env}: .env.example shows empty, default is {default!r}")
            continue
        clean_env.setenv(env, values[env])
        try:
            parsed = getattr(cls(), name)
        finally:
            clean_env.delenv(env)
        if hasattr(parsed, "get_secret_value"):
            parsed, default = parsed.get_secret_value(), default.get_secret_value()
        assert parsed == default, (env, values[env], parsed, default)


def test_every_compose_variable_is_documented() -> None:
    values = example_values()
    interpolated = gen_env_example.compose_interpolations([BASE, UNRAID])
    assert interpolated, "no ${VAR} found in the compose files"
    for name, default in interpolated.items():
        assert name in values, f"{name} (compose) missing from .env.example"
        assert name in gen_env_example.COMPOSE_DOCS, f"{name}: no description"
        if default is not None and name not in gen_env_example.ACTIVE:
            assert values[name] == default, (name, values[name], default)


DIRECT = re.compile(r"""os\.environ\[\s*["'](LOKI_[A-Z0-9_]+)["']\s*\]""")


@pytest.mark.parametrize("profile", ["gpu", "cpu"])
def test_every_variable_a_service_reads_is_set_or_defaulted(
    profile: str, clean_env: pytest.MonkeyPatch
) -> None:
    out = render([BASE], [profile])
    assert out.returncode == 0, out.stderr
    for name, svc in out.services.items():
        if name not in LOKI_SERVICES:
            continue
        folder, package = LOKI_SERVICES[name]
        env = {**image_for(svc).env, **env_of(svc)}
        cls = settings_class(package)
        fields = {f"LOKI_{f.upper()}" for f in cls.model_fields}
        # No typo: every LOKI_* compose or the image sets is read by that service.
        for key in env:
            if key.startswith("LOKI_"):
                assert key in fields or key in gen_env_example.DIRECT_READS, (
                    f"{name}: {key} is set but no setting of {package} reads it"
                )
        # Everything it reads through Settings is set or has a default, and parses.
        for field_name, info in cls.model_fields.items():
            key = f"LOKI_{field_name.upper()}"
            assert key in env or not info.is_required(), f"{name}: {key} unset and required"
        for key, value in env.items():
            if key.startswith("LOKI_"):
                clean_env.setenv(key, value)
        try:
            settings = cls()
        finally:
            for key in env:
                if key.startswith("LOKI_"):
                    clean_env.delenv(key, raising=False)
        assert str(settings.nats_url) == "nats://nats:4222"
        # Direct reads without a fallback must be set.
        sources = list((ROOT / "services" / folder).rglob("*.py"))
        sources += list((ROOT / "shared/loki_shared").rglob("*.py"))
        for path in sources:
            for key in DIRECT.findall(path.read_text()):
                assert key in env, f"{name}: {path.name} reads {key} with no default"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_setting_is_documented(package: str) -> None:
    """Each variable has a sentence in .env.example: its Settings docstring bullet
    (``- ``LOKI_NAME`` ...``) or its Field description."""
    cls = settings_class(package)
    docs = gen_env_example.docstring_docs(cls)
    missing = [
        f"LOKI_{name.upper()}"
        for name, info in cls.model_fields.items()
        if not (docs.get(f"LOKI_{name.upper()}") or info.description)
    ]
    assert not missing, f"{package}: undocumented settings {missing}"
