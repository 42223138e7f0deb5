// Line icons (24x24, stroked, after Feather's style), built as SVG elements: no icon font to load,
// and crisp at any size. Buttons that show only an icon carry an aria-label.

const SVG = "http://www.w3.org/2000/svg";

const ICONS = {
  menu: [["path", { d: "M3 12h18M3 6h18M3 18h18" }]],
  sliders: [["path", { d: "M4 21v-7M4 10V3M12 21v-9M12 8V3M20 21v-5M20 12V3M1 14h6M9 8h6M17 16h6" }]],
  pencil: [["path", { d: "M17 3a2.85 2.85 0 1 1 4 4L7.5 20.5 2 22l1.5-5.5Z" }]],
  trash: [["path", { d: "M3 6h18M19 6v14a2 2 0 0 1-2 2H7a2 2 0 0 1-2-2V6M8 6V4a2 2 0 0 1 2-2h4a2 2 0 0 1 2 2v2" }]],
  eyeOff: [
    ["path", { d: "M17.94 17.94A10 10 0 0 1 12 20c-7 0-11-8-11-8a18.5 18.5 0 0 1 5.06-5.94M9.9 4.24A9 9 0 0 1 12 4c7 0 11 8 11 8a18.5 18.5 0 0 1-2.16 3.19" }],
    ["path", { d: "M1 1l22 22" }],
  ],
  eye: [["path", { d: "M1 12s4-8 11-8 11 8 11 8-4 8-11 8-11-8-11-8z" }], ["circle", { cx: 12, cy: 12, r: 3 }]],
  copy: [
    ["rect", { x: 9, y: 9, width: 13, height: 13, rx: 2 }],
    ["path", { d: "M5 15H4a2 2 0 0 1-2-2V4a2 2 0 0 1 2-2h9a2 2 0 0 1 2 2v1" }],
  ],
  regenerate: [["path", { d: "M1 4v6h6" }], ["path", { d: "M3.51 15a9 9 0 1 0 2.13-9.36L1 10" }]],
  thumbUp: [["path", { d: "M14 9V5a3 3 0 0 0-3-3l-4 9v11h11.28a2 2 0 0 0 2-1.7l1.38-9a2 2 0 0 0-2-2.3zM7 22H4a2 2 0 0 1-2-2v-7a2 2 0 0 1 2-2h3" }]],
  thumbDown: [["path", { d: "M10 15v4a3 3 0 0 0 3 3l4-9V2H5.72a2 2 0 0 0-2 1.7l-1.38 9a2 2 0 0 0 2 2.3zm7-13h2.67A2.31 2.31 0 0 1 22 4v7a2.31 2.31 0 0 1-2.33 2H17" }]],
  flag: [["path", { d: "M4 15s1-1 4-1 5 2 8 2 4-1 4-1V3s-1 1-4 1-5-2-8-2-4 1-4 1zM4 22v-7" }]],
  left: [["path", { d: "M15 18l-6-6 6-6" }]],
  right: [["path", { d: "M9 18l6-6-6-6" }]],
};

/** An icon as an SVG element, hidden from assistive technology (its button has the name). */
export function icon(name) {
  const svg = document.createElementNS(SVG, "svg");
  for (const [key, value] of Object.entries({
    viewBox: "0 0 24 24", width: 18, height: 18, fill: "none", stroke: "currentColor",
    "stroke-width": 2, "stroke-linecap": "round", "stroke-linejoin": "round", "aria-hidden": "true", focusable: "false",
  })) svg.setAttribute(key, String(value));
  for (const [tag, attrs] of ICONS[name]) {
    const part = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs)) part.setAttribute(key, String(value));
    svg.append(part);
  }
  return svg;
}

/** Put the icons into the page's static buttons (those with a data-icon attribute). */
export function fillIcons(root = document) {
  for (const el of root.querySelectorAll("[data-icon]")) el.replaceChildren(icon(el.dataset.icon));
}
