// The budgets panel: conversation budgets (per pair and per chain) that need a human,
// each with its extend action: the page the hub sends (the most recently updated),
// spent ones first within it.

import { api, teamPath } from "./api.js";
import { $, h } from "./dom.js";
import { meter, panelList } from "./panels.js";
import { S } from "./state.js";
import { applySnapshot } from "./team.js";
import { relTime } from "./time.js";

// The amount typed for each budget, kept across the live updates that redraw the panel
// (an extension's own among them), so a click after one extends by what was typed.
const amounts = new Map();

function budgetItem(b) {
  const used = Number(b.used) || 0;
  const limit = Number(b.limit) || 0;
  const pct = limit ? Math.min(100, Math.round((used / limit) * 100)) : 0;
  const who = b.scope === "pair" ? (b.members || []).join(" ↔ ") : `chain ${String(b.key).slice(6)}`;
  const by = h("input", {
    type: "number",
    min: "1",
    max: "1000",
    value: amounts.get(b.key) || "4",
    class: "extend-by",
    title: "how many more",
    oninput: () => amounts.set(b.key, by.value),
  });
  const button = h("button", {
    type: "button",
    class: "extend",
    text: "extend",
    title: `let this many more ${b.scope === "pair" ? "exchanges" : "hops"} through`,
    // what was typed last for this budget: a live update may have redrawn the panel
    // between the typing and the click, and the box typed into is then gone
    onclick: () => extendBudget(b.key, Number(amounts.get(b.key) || by.value), button),
  });
  return h(
    "li",
    { class: `item budget ${b.spent ? "budget-spent" : ""}`, dataset: { key: b.key, spent: String(!!b.spent) } },
    h(
      "div",
      { class: "item-line" },
      h("b", { class: "peers", text: who }),
      h("span", { class: "spacer" }),
      b.spent ? h("span", { class: "pill pill-closed", text: "spent" }) : null,
    ),
    h(
      "div",
      { class: "item-line" },
      meter(pct, `${used} of ${limit} used`),
      h("span", { class: "turns mono", text: `${used}/${limit}` }),
      h("span", { class: "muted small", text: b.scope === "pair" ? "exchanges" : "hops" }),
    ),
    b.spent && b.resets_at ? h("div", { class: "small muted" }, "resets ", relTime(b.resets_at, "due")) : null,
    h("div", { class: "item-line small" }, by, button),
  );
}

export function renderBudgets() {
  const items = [...S.budgets].sort((x, y) => Number(!!y.spent) - Number(!!x.spent) || y.updated_at - x.updated_at);
  const hidden = S.hidden.budgets || 0; // the snapshot carries the first page
  panelList("budgets", items, budgetItem, hidden, items.length + hidden);
}

function newRequestId() {
  const bytes = new Uint8Array(12);
  crypto.getRandomValues(bytes);
  return `dash-${[...bytes].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
}

// The extension of each budget asked for and not yet answered: key -> {by, id}. A click
// whose answer was lost (a reset, the hub restarting) leaves it here, and the next click
// on that budget sends the same request_id again: the hub answers the budget as it
// stands (replayed) instead of extending a second time. If the amount was changed
// meanwhile, the hub answers a conflict exactly when the first extension went through,
// and the page says so. An answer clears it: the click after that is a new extension.
const extending = new Map();

async function extendBudget(key, by, button) {
  const status = $("budgets-status");
  status.className = "compose-status";
  button.disabled = true;
  if (!extending.has(key)) extending.set(key, { by, id: newRequestId() });
  const asked = extending.get(key);
  try {
    const body = { key, by, request_id: asked.id };
    const r = await api(teamPath("/budgets/extend"), { method: "POST", body });
    extending.delete(key);
    status.textContent = `${key}: ${r.used} of ${r.limit} used`;
    status.classList.add("ok");
    const snap = await api(teamPath("/snapshot"));
    applySnapshot(snap);
  } catch (err) {
    if (err.status === 409 && err.code === "conflict") {
      extending.delete(key);
      status.textContent =
        `${key}: your earlier extension by ${asked.by} went through (its answer was lost); ` +
        `nothing more was extended. Click again to extend by ${by} more.`;
    } else {
      status.textContent = err.message;
    }
    status.classList.add("error");
  } finally {
    button.disabled = false;
  }
}
