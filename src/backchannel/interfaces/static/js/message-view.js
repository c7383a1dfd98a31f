// The drawer's view of one message: its text, each copy's state and its history.

import { $, clear, facts, h, mono } from "./dom.js";
import { STATE_OF_EVENT, stateChip } from "./labels.js";
import { clock, fullTime } from "./time.js";

export function renderMessage(m) {
  $("drawer-kicker").textContent = `${m.kind} message`;
  const title = $("drawer-title");
  clear(title);
  title.append(h("span", { text: m.from }), h("span", { class: "muted", text: " → " }), h("span", { text: m.to }));
  const body = $("drawer-body");
  clear(body);
  body.append(
    facts([
      ["id", mono(m.message_id)],
      ["status", stateChip(m.status)],
      ["sent", `${fullTime(m.created_at)}`],
      ["summary", m.summary],
      ["from session", m.sender_session ? mono(m.sender_session) : null],
    ]),
    h("h3", { text: "Text" }),
    h("pre", { class: "message-text", text: m.text }),
    h("h3", { text: "Deliveries" }),
    h(
      "table",
      { class: "grid deliveries" },
      h("thead", {}, h("tr", {}, ["to", "session", "state", "attempts", "updated"].map((c) => h("th", { text: c })))),
      h(
        "tbody",
        {},
        m.deliveries.map((d) =>
          h(
            "tr",
            {},
            h("td", { text: d.to }),
            h("td", {}, d.session ? mono(d.session) : h("span", { class: "muted", text: "any" })),
            h("td", {}, stateChip(d.state), d.dead_reason ? h("div", { class: "why small", text: d.dead_reason }) : null),
            h("td", { class: "mono", text: String(d.attempts) }),
            h("td", { class: "mono", title: fullTime(d.updated_at), text: clock(d.updated_at) }),
          ),
        ),
      ),
    ),
    h("h3", { text: "History" }),
    h(
      "ol",
      { class: "history" },
      m.history.map((e) =>
        h(
          "li",
          { dataset: { event: e.event } },
          h("span", { class: "mono time", title: fullTime(e.at), text: clock(e.at) }),
          h("span", { class: `event state-${STATE_OF_EVENT[e.event] || "other"}`, text: e.event }),
          h("span", { class: "who", text: e.to }),
          e.detail ? h("span", { class: "detail muted", text: e.detail }) : null,
        ),
      ),
    ),
  );
  if (m.meta && Object.keys(m.meta).length) {
    body.append(h("h3", { text: "Metadata" }), h("pre", { class: "message-text small", text: JSON.stringify(m.meta, null, 2) }));
  }
}
