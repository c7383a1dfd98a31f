// What only the admin may do from the page: give a member a new token, remove a member,
// remove the team.

import { api } from "./api.js";
import { $, clear, h, show } from "./dom.js";
import { signIn } from "./signin.js";
import { S, TEAM_KEY } from "./state.js";

function adminNote(text, isError = false) {
  const note = $("admin-note");
  clear(note);
  note.append(h("span", { class: isError ? "error" : "", text }));
  show(note, true);
}

export function memberActions(name) {
  const act = (label, title, fn) =>
    h("button", { type: "button", class: "admin-action", title, text: label, dataset: { action: label, member: name }, onclick: fn });
  return h(
    "div",
    { class: "member-actions" },
    act("new token", `give ${name} a new token; the old one stops working at once`, async (e) => {
      e.stopPropagation();
      if (!window.confirm(`Give ${name} a new token? Its current token stops working at once.`)) return;
      try {
        const r = await api(`/v1/teams/${encodeURIComponent(S.team)}/members/${encodeURIComponent(name)}/token`, { method: "POST", body: {} });
        adminNote(`New token for ${name} (shown once): ${r.token}`);
      } catch (err) {
        adminNote(err.message, true);
      }
    }),
    act("remove", `remove ${name} from the team`, async (e) => {
      e.stopPropagation();
      if (!window.confirm(`Remove ${name}? Messages waiting for it become dead letters (their senders are told), its links close and its timers are cancelled.`)) return;
      try {
        const r = await api(`/v1/teams/${encodeURIComponent(S.team)}/members/${encodeURIComponent(name)}`, { method: "DELETE" });
        adminNote(`${name} removed: ${r.dead_letters} dead letter(s), ${r.links_closed} link(s) closed, ${r.jobs_cancelled} timer(s) cancelled.`);
      } catch (err) {
        adminNote(err.message, true);
      }
    }),
  );
}

export async function removeTeam() {
  const team = S.team;
  if (!team || window.prompt(`Remove team ${team} and everything it holds? Type its name to confirm.`) !== team) return;
  try {
    const r = await api(`/v1/teams/${encodeURIComponent(team)}`, { method: "DELETE" });
    sessionStorage.removeItem(TEAM_KEY);
    await signIn(S.token, { quiet: true });
    adminNote(`Team ${team} removed; ${r.dropped} undelivered message(s) went with it.`);
  } catch (err) {
    adminNote(err.message, true);
  }
}
