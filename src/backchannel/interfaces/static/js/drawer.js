// The drawer: one message, or one session, read from the hub when it opens and again
// when what it shows may have changed.

import { api, teamPath } from "./api.js";
import { $, clear, h, show } from "./dom.js";
import { renderMessage } from "./message-view.js";
import { renderSession } from "./session-view.js";
import { S } from "./state.js";
import { whenSettled } from "./views.js";

function openDrawer(kind, id) {
  S.drawer = { type: kind, id };
  show($("drawer"), true);
  show($("scrim"), true);
  for (const r of S.rows.values()) r.classList.toggle("open", kind === "message" && r.dataset.id === id);
  refreshDrawer();
}

export function closeDrawer() {
  S.drawer = null;
  show($("drawer"), false);
  show($("scrim"), false);
  for (const r of S.rows.values()) r.classList.remove("open");
}

export const openMessage = (id) => openDrawer("message", id);
export const openSession = (id) => openDrawer("session", id);

let drawerSeq = 0;
export async function refreshDrawer() {
  const d = S.drawer;
  if (!d) return;
  const seq = ++drawerSeq;
  try {
    const path = d.type === "message" ? `/messages/${encodeURIComponent(d.id)}` : `/sessions/${encodeURIComponent(d.id)}`;
    const data = await api(teamPath(path));
    if (seq !== drawerSeq || S.drawer !== d) return;
    if (d.type === "session") d.active = data.session.state === "active";
    // redrawn once a press on what it shows is over (see whenSettled)
    whenSettled("drawer", () => {
      if (seq !== drawerSeq || S.drawer !== d) return;
      if (d.type === "message") renderMessage(data);
      else renderSession(data);
    });
  } catch (err) {
    if (seq !== drawerSeq || S.drawer !== d) return;
    $("drawer-kicker").textContent = d.type;
    $("drawer-title").textContent = d.id;
    const body = $("drawer-body");
    clear(body);
    body.append(h("p", { class: "form-error", text: err.message }));
  }
}
