// The dead letters panel: copies the hub gave up on, seen in this page's traffic.

import { h } from "./dom.js";
import { openMessage } from "./drawer.js";
import { panelList } from "./panels.js";
import { S } from "./state.js";
import { relTime } from "./time.js";

// The panel lists the latest of them and counts the rest (a long-lived team may have
// thousands); each is still a row of the timeline while the timeline holds it.
const SHOWN = 50;

export function renderDead() {
  const items = [...S.dead.values()].sort((x, y) => y.at - x.at || y.cursor - x.cursor);
  const shown = items.slice(0, SHOWN);
  const hidden = S.deadForgotten + items.length - shown.length;
  panelList("dead", shown, (d) =>
    h(
      "li",
      { class: "item dead", dataset: { id: d.id } },
      h(
        "button",
        { type: "button", class: "item-button", onclick: () => openMessage(d.id) },
        h(
          "div",
          { class: "item-line" },
          h("b", { text: d.from || "?" }),
          h("span", { class: "muted", text: " → " }),
          h("b", { text: d.to }),
          h("span", { class: "spacer" }),
          relTime(d.at),
        ),
        h("div", { class: "note", text: d.summary || d.id }),
        h("div", { class: "why small", text: d.reason }),
      ),
    ),
    hidden,
    shown.length + hidden,
    { more: false },
  );
}
