// The budgets panel: conversation budgets (per pair and per chain) that need a human,
// spent ones first, each with its extend action.

import { api, teamPath } from "./api.js";
import { $, h } from "./dom.js";
import { meter, panelList } from "./panels.js";
import { S } from "./state.js";
import { applySnapshot } from "./team.js";
import { relTime } from "./time.js";

function budgetItem(b) {
  const used = Number(b.used) || 0;
  const limit = Number(b.limit) || 0;
  const pct = limit ? Math.min(100, Math.round((used / limit) * 100)) : 0;
  const who = b.scope === "pair" ? (b.members || []).join(" ↔ ") : `chain ${String(b.key).slice(6)}`;
  const by = h("input", { type: "number", min: "1", max: "1000", value: "4", class: "extend-by", title: "how many more" });
  const button = h("button", {
    type: "button",
    class: "extend",
    text: "extend",
    title: `let this many more ${b.scope === "pair" ? "exchanges" : "hops"} through`,
    onclick: () => extendBudget(b.key, Number(by.value), button),
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

async function extendBudget(key, by, button) {
  const status = $("budgets-status");
  status.className = "compose-status";
  button.disabled = true;
  try {
    const r = await api(teamPath("/budgets/extend"), { method: "POST", body: { key, by } });
    status.textContent = `${key}: ${r.used} of ${r.limit} used`;
    status.classList.add("ok");
    const snap = await api(teamPath("/snapshot"));
    applySnapshot(snap);
  } catch (err) {
    status.textContent = err.message;
    status.classList.add("error");
  } finally {
    button.disabled = false;
  }
}
