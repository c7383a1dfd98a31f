// The members panel: each member with its state, sessions and last activity (a click
// filters the timeline by it); and the member choices of the filter and the composer.

import { memberActions } from "./admin.js";
import { $, clear, h } from "./dom.js";
import { openSession } from "./drawer.js";
import { S } from "./state.js";
import { relTime } from "./time.js";
import { setMemberFilter } from "./timeline.js";

function lastActivity(m) {
  return Math.max(m.last_activity || 0, S.activity.get(m.name) || 0) || null;
}

export function renderMembers() {
  const list = $("members");
  clear(list);
  $("members-count").textContent = S.members.length ? String(S.members.length) : "";
  for (const m of S.members) {
    const state = m.state || "no session";
    const selected = S.filter.member === m.name;
    const sessions = (m.sessions || []).map((s) =>
      h(
        "li",
        {},
        h(
          "button",
          {
            type: "button",
            class: "session-link",
            title: `open session ${s.session_id}`,
            onclick: (e) => {
              e.stopPropagation();
              openSession(s.session_id);
            },
          },
          h("span", { class: `dot state-${s.state}` }),
          h("span", { class: "mono", text: s.session_id }),
          h("span", { class: "muted", text: ` ${s.state}` }),
        ),
      ),
    );
    list.append(
      h(
        "li",
        {
          class: `member${selected ? " selected" : ""}`,
          dataset: { member: m.name, state },
        },
        h(
          "button",
          {
            type: "button",
            class: "member-main",
            title: selected ? "show every member's messages" : `show only ${m.name}'s messages`,
            onclick: () => setMemberFilter(selected ? "" : m.name),
          },
          h("span", { class: `dot state-${state.replace(" ", "-")}` }),
          h("span", { class: "member-name", text: m.name }),
          h("span", { class: "badge kind-badge", text: m.kind }),
          h("span", {
            class: `member-state state-text-${state.replace(" ", "-")}`,
            text: state,
            title: m.presence ? `from its inbox traffic; last: ${m.presence.last_event}` : "",
          }),
          m.push_circuit
            ? h("span", { class: "badge push-down", text: "push down", title: m.push_circuit.reason })
            : null,
          h("span", { class: "member-activity muted small" }, relTime(lastActivity(m))),
        ),
        sessions.length ? h("ul", { class: "sessions" }, sessions) : null,
        m.sessions_total > sessions.length
          ? h("div", { class: "muted small", text: `+ ${m.sessions_total - sessions.length} older sessions` })
          : null,
        S.me && S.me.admin && m.name !== "user" ? memberActions(m.name) : null,
      ),
    );
  }
}

export function renderMemberOptions() {
  const names = S.members.map((m) => m.name);
  const sel = $("filter-member");
  const keep = sel.value;
  clear(sel);
  sel.append(h("option", { value: "", text: "all members" }));
  for (const n of [...names, "hub"]) sel.append(h("option", { value: n, text: n }));
  sel.value = names.includes(keep) || keep === "hub" ? keep : "";

  const to = $("compose-to");
  const was = to.value;
  clear(to);
  for (const n of names.filter((n) => n !== "user")) to.append(h("option", { value: n, text: n }));
  to.append(h("option", { value: "*", text: "* everyone" }));
  if ([...to.options].some((o) => o.value === was)) to.value = was;
}
