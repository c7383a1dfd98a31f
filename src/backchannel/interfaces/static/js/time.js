// Times as the page shows them, by the hub's clock (each snapshot says what time it is
// there). Elements whose text depends on the time carry data-ago / data-due, and one
// ticker updates them.

import { h } from "./dom.js";

const pad = (n) => String(n).padStart(2, "0");

export function clock(ts) {
  if (ts === null || ts === undefined) return "";
  const d = new Date(ts * 1000);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

export function fullTime(ts) {
  return ts ? new Date(ts * 1000).toLocaleString() : "";
}

function span(seconds) {
  const s = Math.abs(seconds);
  if (s < 1) return "now";
  if (s < 60) return `${Math.floor(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h`;
  return `${Math.floor(s / 86400)} d`;
}

let skew = 0;
const hubNow = () => Date.now() / 1000 + skew;

// Set the page's idea of the hub's clock from a snapshot's `now`.
export function setHubNow(now) {
  skew = now - Date.now() / 1000;
}

export function ago(ts) {
  if (!ts) return "never";
  const d = hubNow() - ts;
  return d < 1 ? "just now" : `${span(d)} ago`;
}

function dueIn(ts) {
  if (!ts) return "";
  const d = ts - hubNow();
  return d >= 0 ? `due in ${span(d)}` : `overdue ${span(d)}`;
}

export function relTime(ts, mode) {
  const el = h("span", { class: "reltime", title: fullTime(ts) });
  if (mode === "due") el.dataset.due = ts ?? "";
  else el.dataset.ago = ts ?? "";
  el.textContent = mode === "due" ? dueIn(ts) : ago(ts);
  return el;
}

export function tick() {
  for (const el of document.querySelectorAll("[data-ago]")) {
    el.textContent = ago(Number(el.dataset.ago) || null);
  }
  for (const el of document.querySelectorAll("[data-due]")) {
    el.textContent = dueIn(Number(el.dataset.due) || null);
  }
}
