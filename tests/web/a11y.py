"""Accessibility checks run inside the page: every control has a name, and every visible text meets
the WCAG AA contrast ratio against the background it is drawn on (4.5:1, or 3:1 for large text)."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import Page

_CHECK = """() => {
  const shown = (el) => {
    if (el.closest('[inert], [hidden]')) return false;
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.height === 0) return false;
    for (let e = el; e; e = e.parentElement) {
      const style = getComputedStyle(e);
      if (style.visibility === 'hidden' || style.display === 'none' || Number(style.opacity) === 0) return false;
    }
    return true;
  };
  const nameOf = (el) => {
    const labelledBy = el.getAttribute('aria-labelledby');
    return (
      el.getAttribute('aria-label') ||
      (labelledBy && document.getElementById(labelledBy)?.textContent) ||
      (el.labels && [...el.labels].map((l) => l.textContent).join(' ')) ||
      (el.tagName !== 'INPUT' && el.tagName !== 'TEXTAREA' && el.textContent) ||
      el.getAttribute('title') || ''
    ).trim();
  };
  const unnamed = [...document.querySelectorAll('button, a[href], input, select, textarea, [role=button]')]
    .filter(shown).filter((el) => !nameOf(el)).map((el) => el.outerHTML.slice(0, 120));

  const rgba = (text) => { const v = text.match(/[\\d.]+/g).map(Number); return v.length === 3 ? [...v, 1] : v; };
  const over = (top, bottom) => top.slice(0, 3).map((c, i) => c * top[3] + bottom[i] * (1 - top[3]));
  const background = (el) => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c[3] > 0) layers.push(c);
      if (c[3] === 1) break;
    }
    let color = [255, 255, 255];
    for (const layer of layers.reverse()) color = over(layer, color);
    return color;
  };
  const luminance = (rgb) => {
    const [r, g, b] = rgb.map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const lowContrast = [];
  for (const el of document.querySelectorAll('body *')) {
    const text = [...el.childNodes].filter((n) => n.nodeType === 3).map((n) => n.textContent).join('').trim();
    if (!text || !shown(el) || el.closest(':disabled')) continue;
    const style = getComputedStyle(el);
    const bg = background(el);
    const fg = over(rgba(style.color), bg);
    const [hi, lo] = [luminance(fg), luminance(bg)].sort((a, b) => b - a);
    const ratio = (hi + 0.05) / (lo + 0.05);
    const size = parseFloat(style.fontSize);
    const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
    if (ratio < (large ? 3 : 4.5)) lowContrast.push(`${ratio.toFixed(2)}: ${el.tagName} "${text.slice(0, 40)}"`);
  }
  return { unnamed, lowContrast };
}"""


def accessibility_problems(page: Page) -> dict[str, Any]:
    return dict(page.evaluate(_CHECK))


def assert_accessible(page: Page) -> None:
    problems = accessibility_problems(page)
    assert problems == {"unnamed": [], "lowContrast": []}, problems


def focus_order(page: Page, steps: int) -> list[str]:
    """Press Tab ``steps`` times from the top; the accessible name of each control reached (every
    one of which must be visible: nothing hidden, off screen or behind a drawer takes focus)."""
    page.evaluate("() => document.activeElement?.blur()")
    reached = []
    for _ in range(steps):
        page.keyboard.press("Tab")
        info = page.evaluate(
            """() => {
              const el = document.activeElement;
              const box = el.getBoundingClientRect();
              const name = (el.getAttribute('aria-label') || (el.labels && el.labels[0]?.textContent)
                            || el.textContent || el.tagName).trim();
              const onScreen = box.width > 0 && box.height > 0 && box.right > 0 && box.left < innerWidth;
              return { name, onScreen };
            }"""
        )
        assert info["onScreen"], f"focus went to something not on screen: {info['name']}"
        reached.append(info["name"])
    return reached
