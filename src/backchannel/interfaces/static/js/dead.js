// The dead letters panel: copies the hub gave up on, the latest ones, as each snapshot
// lists them (from the hub's records, not from the traffic this page was sent, which
// is only the latest events).

import { h } from "./dom.js";
import { openMessage } from "./drawer.js";
import { panelList } from "./panels.js";
import { S } from "./state.js";
import { relTime } from "./time.js";

export function renderDead() {
  const shown = S.dead;
  const hidden = S.hidden.dead || 0;
  panelList("dead", shown, (d) =>
    h(
      "li",
      { class: "item dead", dataset: { id: d.message_id } },
      h(
        "button",
        { type: "button", class: "item-button", onclick: () => openMessage(d.message_id) },
        h(
          "div",
          { class: "item-line" },
          h("b", { text: d.from || "?" }),
          h("span", { class: "muted", text: " → " }),
          h("b", { text: d.to }),
          h("span", { class: "spacer" }),
          relTime(d.at),
        ),
        h("div", { class: "note", text: d.summary || d.message_id }),
        h("div", { class: "why small", text: d.reason || "no reason given" }),
      ),
    ),
    hidden,
    shown.length + hidden,
    { more: false },
  );
}
