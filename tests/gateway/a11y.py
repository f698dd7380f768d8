"""What the browser tests check of every view and dialog of the web UI (issue 41):

- :func:`assert_accessible`: axe-core (vendored, ``static/vendor/axe.min.js``; injected into
  the page by the test, never loaded by ``index.html``) finds no serious or critical
  violation in the document as it stands (an open dialog, the phone's drawer...);
- :func:`small_targets`: the visible controls smaller than ``size`` x ``size`` CSS px (44 on
  a phone, WCAG 2.5.5; a checkbox or radio counts with its label, which takes the tap too).
"""

from __future__ import annotations

from pathlib import Path
from pprint import pformat
from typing import Any

import loki_gateway

AXE = Path(loki_gateway.__file__).resolve().parent / "static" / "vendor" / "axe.min.js"

RUN_AXE = """async () => {
  const r = await axe.run(document, { resultTypes: ["violations"] });
  return r.violations.map((v) => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 6).map((n) => n.target.join(" ") + " :: " + (n.failureSummary || "")),
  }));
}"""


def violations(page: Any) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations of the page as it stands."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    found = page.evaluate(RUN_AXE)
    return [v for v in found if v["impact"] in ("serious", "critical")]


def assert_accessible(page: Any, where: str) -> None:
    """No serious or critical axe-core violation in the page (``where`` names the view)."""
    bad = violations(page)
    assert not bad, f"axe-core in {where}:\n{pformat(bad, width=120)}"


# The controls a person can hit: what takes focus or a click. Links inside a message's text
# are inline text (WCAG 2.5.5's exception), not counted.
MEASURE = """(size) => {
  const sel = "button, a[href], input:not([type=hidden]), select, textarea, summary, "
    + "[tabindex]:not([tabindex='-1']), [role=button], [role=tab], label.button";
  const modal = Array.from(document.querySelectorAll("dialog[open]")).pop() || null;
  const out = [];
  for (const el of document.querySelectorAll(sel)) {
    if (el.closest(".msg") && el.tagName === "A") continue;
    if (modal && !modal.contains(el)) continue;   // behind a modal: inert
    const cs = getComputedStyle(el);
    if (cs.visibility === "hidden" || cs.display === "none") continue;
    let r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue; // not shown (hidden, or in a closed <details>)
    if (r.right <= 0 || r.left >= innerWidth) continue; // slid out (the closed drawer)
    const label = el.closest("label");
    if (label && (el.type === "checkbox" || el.type === "radio")) r = label.getBoundingClientRect();
    if (r.width < size - 0.5 || r.height < size - 0.5) {
      const name = el.getAttribute("aria-label") || el.textContent.trim().slice(0, 30) || el.name || el.id;
      out.push(`${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""}${el.className ? "." + String(el.className).split(" ").join(".") : ""} "${name}" ${Math.round(r.width)}x${Math.round(r.height)}`);
    }
  }
  return out;
}"""


def small_targets(page: Any, size: int) -> list[str]:
    """The visible controls under ``size`` x ``size`` px, described (tag, id, class, name,
    size)."""
    return list(page.evaluate(MEASURE, size))


def assert_targets(page: Any, size: int, where: str) -> None:
    """Every visible control of the page is at least ``size`` x ``size`` px."""
    small = small_targets(page, size)
    assert not small, f"controls under {size}x{size} px in {where}:\n" + "\n".join(small)


CONTRAST = """(el) => {
  const rgb = (s) => (s.match(/[\\d.]+/g) || []).slice(0, 3).map(Number);
  const lum = (c) => {
    const [r, g, b] = c.map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  let bgEl = el, bg = "rgba(0, 0, 0, 0)";
  while (bgEl) {
    bg = getComputedStyle(bgEl).backgroundColor;
    if (!/rgba\\(.*, 0\\)$/.test(bg) && bg !== "transparent") break;
    bgEl = bgEl.parentElement;
  }
  const a = lum(rgb(getComputedStyle(el).color)), b = lum(rgb(bg));
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
}"""


def contrast(page: Any, selector: str) -> float:
    """The contrast ratio (WCAG) of the element's text on its background."""
    return float(page.eval_on_selector(selector, CONTRAST))
