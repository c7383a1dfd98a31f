// The delegations panel: a tally by state, then pending delegations and the latest
// finished ones.

import { $, clear, h } from "./dom.js";
import { DELEGATION_STATES, firstLine, stateLabel } from "./labels.js";
import { panelList, sessionButton } from "./panels.js";
import { S } from "./state.js";
import { relTime } from "./time.js";

function delegationDetail(d) {
  switch (d.state) {
    case "pending":
      return h("div", { class: "small muted detail" }, "answer ", relTime(d.deadline, "due"));
    case "answered":
    case "late":
      return h(
        "div",
        { class: "small detail" },
        h("span", { class: "muted" }, d.state === "late" ? "answered after its deadline, " : "answered ", relTime(d.answered_at)),
        d.result ? h("div", { class: "result", title: d.result, text: firstLine(d.result) }) : null,
      );
    default: // timed_out, failed
      return h("div", { class: "why small clamp", title: d.error || "", text: d.error || stateLabel(d.state) });
  }
}

function delegationItem(d) {
  return h(
    "li",
    { class: "item delegation", dataset: { delegationId: d.delegation_id, state: d.state } },
    h(
      "div",
      { class: "item-line" },
      h("b", { text: d.caller }),
      h("span", { class: "muted", text: " ⇢ " }),
      h("b", { text: d.callee }),
      h("span", { class: `pill pill-${d.state}`, text: stateLabel(d.state) }),
    ),
    h("div", { class: "note task", title: d.task, text: firstLine(d.task) }),
    delegationDetail(d),
    d.callee_session
      ? h("div", { class: "item-line small" }, h("span", { class: "muted", text: "in" }), sessionButton(d.callee_session, ""))
      : null,
  );
}

export function renderDelegations() {
  const tally = $("delegation-tally");
  clear(tally);
  const counts = S.tally || {};
  const total = Object.values(counts).reduce((a, b) => a + b, 0) || S.delegations.length;
  if (total) {
    for (const st of DELEGATION_STATES) {
      const n = counts[st] || 0;
      if (st === "failed" && !n) continue;
      tally.append(
        h("span", { class: `tally-item ${n ? `pill-${st}` : "zero"}`, dataset: { state: st } }, h("b", { text: String(n) }), ` ${stateLabel(st)}`),
      );
    }
  }
  panelList("delegations", S.delegations, delegationItem, S.hidden.delegations || 0, total);
}
