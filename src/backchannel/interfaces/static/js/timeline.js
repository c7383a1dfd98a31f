// The timeline: one row per message, updated from the team's delivery events, and the
// filters by member and kind.

import { $, clear, h, show } from "./dom.js";
import { openMessage, refreshDrawer } from "./drawer.js";
import { STATE_OF_EVENT, stateChip } from "./labels.js";
import { S } from "./state.js";
import { clock, fullTime } from "./time.js";
import { render, scheduleRender, whenSettled } from "./views.js";

// The rows the timeline keeps (the latest messages). A stream opens with the team's
// latest MAX_ROWS events, not its whole history: older ones could only be dropped.
export const MAX_ROWS = 1000;
// A message with copies in several states shows the first of these it has.
const STATE_ORDER = ["queued", "leased", "delivered", "acked", "dead"];

function touch(member, at) {
  if (!member || !at) return;
  if ((S.activity.get(member) || 0) < at) S.activity.set(member, at);
}

// Forget the messages, rows and activity seen in traffic (a new team, or a stream that
// resumes past events this page never saw).
export function resetTimeline() {
  S.messages.clear();
  S.rows.clear();
  S.activity.clear();
  S.older = false;
  clear($("timeline"));
}

export function applyTraffic(ev) {
  S.cursor = Math.max(S.cursor, ev.cursor || 0);
  let msg = S.messages.get(ev.message_id);
  if (!msg) {
    msg = {
      id: ev.message_id,
      from: ev.from,
      kind: ev.kind || "direct",
      summary: ev.summary || "",
      at: ev.at,
      to: new Map(),
      events: [],
    };
    S.messages.set(msg.id, msg);
  }
  msg.events.push(ev);
  const state = STATE_OF_EVENT[ev.event];
  if (state && ev.to) msg.to.set(ev.to, state);
  else if (ev.to && !msg.to.has(ev.to)) msg.to.set(ev.to, "queued");
  if (ev.event === "queued") touch(ev.from, ev.at);
  else touch(ev.to, ev.at);
  // drawn once a press is over (see whenSettled): a row redrawn between the press and
  // the release would not open, nor one a new row moved down; as the message then is
  const id = msg.id;
  whenSettled(`row ${id}`, () => S.messages.has(id) && updateRow(S.messages.get(id)));
  scheduleRender("members");
  if (S.drawer && S.drawer.type === "message" && S.drawer.id === msg.id) refreshDrawer();
}

function overallState(msg) {
  const states = new Set(msg.to.values());
  for (const s of STATE_ORDER) if (states.has(s)) return s;
  return "queued";
}

function recipientsText(msg) {
  const names = [...msg.to.keys()];
  if (!names.length) return "…";
  if (names.length <= 2) return names.join(", ");
  return `${names.length} members`;
}

function updateRow(msg) {
  let row = S.rows.get(msg.id);
  if (!row) {
    row = h("div", {
      class: "row",
      role: "listitem",
      tabindex: "0",
      dataset: { id: msg.id, kind: msg.kind },
      onclick: () => openMessage(msg.id),
      onkeydown: (e) => {
        if (e.key === "Enter" || e.key === " ") {
          e.preventDefault();
          openMessage(msg.id);
        }
      },
    });
    S.rows.set(msg.id, row);
    $("timeline").prepend(row);
    while (S.rows.size > MAX_ROWS) {
      const [oldest] = S.rows.keys();
      S.rows.get(oldest).remove();
      S.rows.delete(oldest);
      S.messages.delete(oldest);
      S.older = true;
    }
  }
  clear(row);
  const state = overallState(msg);
  const n = msg.to.size;
  const acked = [...msg.to.values()].filter((s) => s === "acked").length;
  row.dataset.state = state;
  row.dataset.from = msg.from || "";
  row.dataset.to = [...msg.to.keys()].join(" ");
  row.append(
    h("span", { class: "cell time mono", title: fullTime(msg.at), text: clock(msg.at) }),
    h(
      "span",
      { class: "cell route" },
      h("span", { class: "from", text: msg.from || "?" }),
      h("span", { class: "arrow", text: " → " }),
      h("span", { class: "to", title: [...msg.to.keys()].join(", "), text: recipientsText(msg) }),
    ),
    h("span", { class: `cell kind kind-${msg.kind}`, text: msg.kind }),
    h("span", { class: "cell summary", text: msg.summary || "(no text)" }),
    h(
      "span",
      { class: "cell status", title: [...msg.to].map(([m, s]) => `${m}: ${s}`).join("\n") },
      stateChip(state),
      n > 1 ? h("span", { class: "progress mono", text: `${acked}/${n} acked` }) : null,
    ),
  );
  applyFilterTo(row);
  scheduleRender("count");
}

function matches(row) {
  const { member, kind } = S.filter;
  if (kind && row.dataset.kind !== kind) return false;
  if (member && row.dataset.from !== member && !row.dataset.to.split(" ").includes(member)) return false;
  return true;
}

function applyFilterTo(row) {
  row.hidden = !matches(row);
}

function applyFilters() {
  for (const row of S.rows.values()) applyFilterTo(row);
  show($("filter-clear"), Boolean(S.filter.member || S.filter.kind));
  render("members");
  renderCount();
}

export function renderCount() {
  const total = S.rows.size;
  let shown = 0;
  for (const row of S.rows.values()) if (!row.hidden) shown += 1;
  const filtered = S.filter.member || S.filter.kind;
  // a timeline that starts after older messages says so: never a part shown as the whole
  const latest = S.older ? "latest " : "";
  const count = $("timeline-count");
  count.textContent = filtered
    ? `${shown} of ${latest}${total}`
    : total
      ? `${latest}${total} messages${S.older ? " (older ones not shown)" : ""}`
      : "";
  count.title = S.older
    ? `the timeline starts with the team's latest ${MAX_ROWS} delivery events; older messages are not shown`
    : "";
  const empty = $("timeline-empty");
  empty.textContent = total ? "no messages match these filters" : S.live ? "no messages yet" : "loading…";
  show(empty, shown === 0);
}

export function setMemberFilter(name) {
  S.filter.member = name;
  $("filter-member").value = name;
  applyFilters();
}

export function setKindFilter(kind) {
  S.filter.kind = kind;
  applyFilters();
}

export function clearFilters() {
  S.filter = { member: "", kind: "" };
  $("filter-member").value = "";
  $("filter-kind").value = "";
  applyFilters();
}
