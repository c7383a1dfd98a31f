// What the side panels share: a list with its count, its empty note and "show more";
// reading a bigger page of a panel; a button that opens a session; a meter.
// The records are the hub's own JSON (Link, Timer and Delegation .to_json()).
// Snapshots carry the first page of each panel; "show more" reads bigger pages.

import { api, teamPath } from "./api.js";
import { $, clear, h, show } from "./dom.js";
import { openSession } from "./drawer.js";
import { S } from "./state.js";
import { render } from "./views.js";

const PAGE = 50;

export async function refreshPanel(kind) {
  const gen = S.gen;
  let data;
  try {
    data = await api(teamPath(`/${kind}?limit=${S.pageSize[kind]}`));
  } catch (err) {
    return; // the next snapshot tries again
  }
  if (gen !== S.gen) return;
  S[kind] = data[kind] || [];
  S.hidden[kind] = kind === "timers" ? data.total - S[kind].length : data.hidden;
  render(kind);
}

function showMore(kind) {
  S.pageSize[kind] = Math.min((S.pageSize[kind] || PAGE) + PAGE * 2, 500);
  refreshPanel(kind);
}

// `more: false`: a panel with no endpoint to read further pages from (it only counts
// what it leaves out).
export function panelList(name, items, draw, hidden = 0, total = items.length, { more: pages = true } = {}) {
  const list = $(name);
  clear(list);
  for (const item of items) list.append(draw(item));
  if (hidden > 0) {
    const more = pages && (S.pageSize[name] || PAGE) < 500;
    list.append(
      h(
        "li",
        { class: "more muted small" },
        h("span", { text: `+ ${hidden} more not shown ` }),
        more ? h("button", { type: "button", class: "show-more", onclick: () => showMore(name), text: "show more" }) : null,
      ),
    );
  }
  $(`${name}-count`).textContent = total ? String(total) : "";
  show($(`${name}-empty`), total === 0);
}

export function sessionButton(sid, fallback) {
  if (!sid) return h("span", { class: "muted", text: fallback });
  return h("button", {
    type: "button",
    class: "session-ref mono",
    title: `open session ${sid}`,
    text: sid,
    onclick: (e) => {
      e.stopPropagation();
      openSession(sid);
    },
  });
}

export function meter(pct, title) {
  const fill = h("div", { class: "meter-fill" });
  fill.style.width = `${pct}%`; // CSSOM, which the page's CSP allows (style attributes it does not)
  return h("div", { class: "meter", title }, fill);
}
