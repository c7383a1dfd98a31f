// The drawer's view of one session: its facts, the links, timers and delegations the
// snapshot knows it by, and the end of its transcript.

import { $, clear, facts, h, mono } from "./dom.js";
import { closeReason, firstLine, stateLabel } from "./labels.js";
import { S } from "./state.js";
import { clock, fullTime, relTime } from "./time.js";

// One line of a session's transcript (SessionEvent.to_json(): kind, text, data, turn, at).
const TRANSCRIPT_LABELS = {
  turn_start: "turn start",
  thought: "thought",
  tool_call: "tool call",
  tool_result: "tool result",
  agent_output: "output",
  agent_stop: "stop",
  checkpoint: "checkpoint",
  input: "input",
  sent: "sent",
  duplicate_dropped: "duplicate dropped",
  routing_error: "routing error",
  session: "session",
};

function eventAbout(e) {
  const d = e.data || {};
  if (e.kind === "sent" && d.to) return `→ ${d.to}`;
  if (e.kind === "input" && d.from) return `from ${d.from}${d.kind && d.kind !== "direct" ? ` (${d.kind})` : ""}`;
  if (e.kind === "tool_call" && typeof d.name === "string") return d.name;
  if (e.kind === "turn_start" && d.checkpoint) return "checkpoint";
  if (e.kind === "turn_start" && d.retried) return "retried";
  return "";
}

function eventText(e) {
  if (e.text) return e.text;
  const d = e.data || {};
  if (e.kind === "tool_call" && d.input !== undefined) return JSON.stringify(d.input, null, 2);
  if (e.kind === "tool_call" || e.kind === "tool_result") {
    const rest = Object.fromEntries(Object.entries(d).filter(([k]) => k !== "name"));
    return Object.keys(rest).length ? JSON.stringify(rest, null, 2) : "";
  }
  return "";
}

// The session view lists what the snapshot knows about the session, one line each.
function miniLink(l, member) {
  const peer = member === l.initiator ? l.responder : l.initiator;
  return h(
    "li",
    { class: `mini link link-${l.state}`, dataset: { linkId: l.link_id, state: l.state } },
    h("span", { class: "mini-what" }, h("span", { class: "muted", text: "↔ " }), h("b", { text: peer })),
    h("span", { class: "turns mono", title: `${l.turns_used} of ${l.budget} turns used`, text: `${l.turns_used}/${l.budget}` }),
    h("span", { class: "mini-note why", text: l.state === "closed" ? closeReason(l) : "" }),
    h("span", { class: `pill pill-${l.state}`, text: l.state }),
  );
}

function miniTimer(t) {
  return h(
    "li",
    { class: "mini timer", dataset: { timerId: String(t.timer_id), state: t.state } },
    h(
      "span",
      { class: "mini-what" },
      h("span", { class: `intent intent-${t.intent}`, text: String(t.intent).toUpperCase() }),
      t.target ? h("span", { class: "muted", text: ` → ${t.target}` }) : null,
    ),
    h("span", { class: "mini-note note", title: t.note, text: t.note }),
    relTime(t.due_at, "due"),
  );
}

function miniDelegation(d, sid) {
  const outgoing = d.caller_session === sid;
  return h(
    "li",
    { class: "mini delegation", dataset: { delegationId: d.delegation_id, state: d.state } },
    h(
      "span",
      { class: "mini-what" },
      h("span", { class: "muted", text: outgoing ? "⇢ " : "⇠ " }),
      h("b", { text: outgoing ? d.callee : d.caller }),
    ),
    h("span", { class: "mini-note note", title: d.task, text: firstLine(d.task) }),
    h("span", { class: `pill pill-${d.state}`, text: stateLabel(d.state) }),
  );
}

// `loaded` and `hidden`: how many of the team's records of this kind the page holds
// and how many more it has not loaded (a session's may be among those: it says so).
function sessionRecords(title, items, render, loaded, hidden = 0) {
  if (!items.length && !hidden) return null;
  const out = [h("h3", { text: title })];
  if (items.length) out.push(h("ul", { class: "minis" }, items.map(render)));
  if (hidden) {
    const kind = title.toLowerCase();
    const text = `From the ${loaded} ${kind} this page has loaded: the team has ${hidden} more (show more in the ${title} panel).`;
    out.push(h("p", { class: "muted small records-note", text }));
  }
  return out;
}

export function renderSession(data) {
  const s = data.session;
  const sid = s.session_id;
  $("drawer-kicker").textContent = `session of ${s.member}`;
  const title = $("drawer-title");
  clear(title);
  title.append(mono(sid));
  const body = $("drawer-body");
  clear(body);
  body.append(
    facts([
      ["member", s.member],
      ["state", h("span", { class: `pill pill-${s.state}`, text: s.state })],
      ["turns", mono(String(s.turn))],
      ["opened", fullTime(s.created_at)],
      ["last activity", relTime(s.updated_at)],
      ["last output", s.last_output ? h("span", { class: "note", text: s.last_output }) : null],
    ]),
  );
  // what the snapshot (or the panels' loaded pages) knows about this session: its
  // links, timers and delegations, and how many of the team's are not loaded
  const mine = (...ids) => ids.includes(sid);
  body.append(
    ...[
      sessionRecords(
        "Links",
        S.links.filter((l) => mine(l.initiator_session, l.responder_session)),
        (l) => miniLink(l, s.member),
        S.links.length,
        S.hidden.links,
      ),
      sessionRecords("Timers", S.timers.filter((t) => t.session === sid), miniTimer, S.timers.length, S.hidden.timers),
      sessionRecords(
        "Delegations",
        S.delegations.filter((d) => mine(d.caller_session, d.callee_session)),
        (d) => miniDelegation(d, sid),
        S.delegations.length,
        S.hidden.delegations,
      ),
    ]
      .flat()
      .filter(Boolean),
  );
  body.append(h("h3", { text: "Transcript" }));
  const events = data.transcript || [];
  if (data.note) body.append(h("p", { class: "muted small transcript-note", text: data.note }));
  if (!events.length) {
    body.append(h("p", { class: "empty", text: "no transcript yet" }));
    return;
  }
  body.append(
    h(
      "ol",
      { class: "transcript" },
      events.map((e) => {
        const kind = String(e.kind || "event");
        const about = eventAbout(e);
        const text = eventText(e);
        return h(
          "li",
          { class: `tr tr-${kind}`, dataset: { kind, eventId: String(e.event_id ?? "") } },
          h(
            "div",
            { class: "tr-head" },
            h("span", { class: "tr-type", text: TRANSCRIPT_LABELS[kind] || kind.replaceAll("_", " ") }),
            about ? h("span", { class: "tr-about", text: about }) : null,
            h("span", { class: "spacer" }),
            e.turn ? h("span", { class: "muted small", text: `turn ${e.turn}` }) : null,
            e.at ? h("span", { class: "mono muted small", title: fullTime(e.at), text: clock(e.at) }) : null,
          ),
          text ? h("pre", { class: "tr-text", text }) : null,
        );
      }),
    ),
  );
}
