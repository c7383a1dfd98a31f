// The links panel: each link's peers, sessions, turns used and, once closed, why.

import { h } from "./dom.js";
import { closeReason } from "./labels.js";
import { meter, panelList, sessionButton } from "./panels.js";
import { S } from "./state.js";
import { ago } from "./time.js";

function linkItem(l) {
  const used = Number(l.turns_used) || 0;
  const budget = Number(l.budget) || 0;
  const pct = budget ? Math.min(100, Math.round((used / budget) * 100)) : 0;
  return h(
    "li",
    {
      class: `item link link-${l.state}`,
      title: `opened by ${l.initiator} ${ago(l.created_at)}`,
      dataset: { linkId: l.link_id, state: l.state },
    },
    h(
      "div",
      { class: "item-line" },
      h(
        "span",
        { class: "peers" },
        h("b", { text: l.initiator }),
        h("span", { class: "muted", text: " ↔ " }),
        h("b", { text: l.responder }),
      ),
      h("span", { class: `pill pill-${l.state}`, text: l.state }),
    ),
    h(
      "div",
      { class: "item-line small link-sessions" },
      sessionButton(l.initiator_session, "?"),
      h("span", { class: "muted", text: "↔" }),
      sessionButton(l.responder_session, "no session yet"),
    ),
    h(
      "div",
      { class: "item-line" },
      meter(pct, `${used} of ${budget} turns used`),
      h("span", { class: "turns mono", title: `${used} of ${budget} turns used`, text: `${used}/${budget}` }),
      h("span", { class: "muted small", text: "turns" }),
    ),
    l.state === "closed"
      ? h("div", { class: "why small", title: l.close_reason || "", dataset: { reason: l.close_reason || "" } }, `closed: ${closeReason(l)}`)
      : null,
  );
}

export function renderLinks() {
  panelList("links", S.links, linkItem, S.hidden.links || 0, S.links.length + (S.hidden.links || 0));
}
