// Tiny DOM helpers. Every piece of hub data goes through h() as text (textContent or a
// text node) or as an attribute value, never as markup: no module parses HTML.

export const $ = (id) => document.getElementById(id);

// h("li", {class, text, dataset, onclick, title, ...}, ...children): an element.
// Children that are not Nodes become text nodes, so untrusted text stays text.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function show(el, visible) {
  el.hidden = !visible;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
}

export function mono(text) {
  return h("span", { class: "mono", text });
}

// A definition list of the pairs whose value is set.
export function facts(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs.filter(([, v]) => v !== null && v !== undefined && v !== "").map(([k, v]) => [h("dt", { text: k }), h("dd", {}, v)]),
  );
}
