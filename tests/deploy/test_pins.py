"""Issue 36: every registry image the compose files pin is at or above the minimum of
deploy/pins.toml (the release that clears the advisories listed there)."""

from __future__ import annotations

import tomllib

import pytest
from packaging.version import Version

from .compose_model import BASE, ROOT, UNRAID, render

PINS = ROOT / "deploy" / "pins.toml"


def table() -> dict[str, dict]:
    """deploy/pins.toml: image name -> {"fixed": [...], "advisories": [...], "why": ...}."""
    with PINS.open("rb") as fh:
        return tomllib.load(fh)["images"]


def registry_images() -> dict[str, str]:
    """``name:tag`` of every compose service that runs a registry image (no ``build``), over
    the base file and the Unraid override, every profile."""
    out: dict[str, str] = {}
    for files in ([BASE], [BASE, UNRAID]):
        model = render(files, ["gpu", "cpu", "tools"]).model
        for name, svc in model["services"].items():
            if "build" not in svc:
                out[name] = svc["image"]
    return out


def release(tag: str) -> Version:
    """The release a tag names: ``v3.5.0`` -> 3.5.0, ``7.4.6-alpine`` -> 7.4.6."""
    return Version(tag.removeprefix("v").split("-", 1)[0])


def clears(version: Version, fixed: list[str]) -> bool:
    """Whether ``version`` has every fix: on a line of ``fixed`` at least its release, on a
    later line than every listed one yes, on an earlier line than the lowest no."""
    lines = {Version(f).release[:2]: Version(f) for f in fixed}
    line = version.release[:2]
    if line in lines:
        return version >= lines[line]
    return line > max(lines)


def test_the_table_rules() -> None:
    """The rule itself, on the nats row: a fixed line's release, a later line, an unfixed one."""
    fixed = table()["nats"]["fixed"]
    assert clears(Version("2.10.27"), fixed) and clears(Version("2.11.1"), fixed)
    assert clears(Version("2.15.1"), fixed)
    assert not clears(Version("2.10.22"), fixed)  # the pin before issue 36
    assert not clears(Version("2.11.0"), fixed)
    assert not clears(Version("2.9.25"), fixed)
    assert not clears(Version("7.4.1"), table()["redis"]["fixed"])  # ditto


@pytest.mark.parametrize("service,image", sorted(registry_images().items()))
def test_every_registry_pin_clears_its_advisories(service: str, image: str) -> None:
    rows = table()
    name, _, tag = image.rpartition(":")
    assert name in rows, f"{service}: {image} is not in deploy/pins.toml"
    row = rows[name]
    assert all(a.startswith(("CVE-", "GHSA-")) for a in row["advisories"]), row
    assert clears(release(tag), row["fixed"]), (
        f"{service}: {image} is below {row['fixed']} ({', '.join(row['advisories'])})"
    )


def test_every_row_names_an_image_in_use() -> None:
    """No stale row: each image of the table is pinned by some compose service."""
    used = {image.rpartition(":")[0] for image in registry_images().values()}
    assert set(table()) == used
