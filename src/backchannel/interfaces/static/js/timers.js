// The timers panel: pending timers, soonest first.

import { h } from "./dom.js";
import { panelList, sessionButton } from "./panels.js";
import { S } from "./state.js";
import { relTime } from "./time.js";

function timerItem(t) {
  const intent = String(t.intent || "timer");
  return h(
    "li",
    { class: "item timer", dataset: { timerId: String(t.timer_id), state: t.state } },
    h(
      "div",
      { class: "item-line" },
      h("span", { class: `intent intent-${intent}`, text: intent.toUpperCase() }),
      h("b", { class: "owner", text: t.member }),
      t.target ? h("span", { class: "target muted", text: `→ ${t.target}` }) : null,
      h("span", { class: "spacer" }),
      t.state === "pending"
        ? relTime(t.due_at, "due")
        : h("span", { class: `pill pill-${t.state}`, text: t.state }),
    ),
    h("div", { class: "note", title: t.note, text: t.note }),
    h("div", { class: "item-line small" }, h("span", { class: "muted", text: "on" }), sessionButton(t.session, "?")),
  );
}

export function renderTimers() {
  const timers = [...S.timers].sort((x, y) => x.due_at - y.due_at);
  const hidden = S.hidden.timers || 0;
  panelList("timers", timers, timerItem, hidden, timers.length + hidden);
}
