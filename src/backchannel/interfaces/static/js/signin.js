// Signing in (the token checked with GET /v1/me, kept in the tab's sessionStorage) and
// out.

import { api } from "./api.js";
import { $, clear, h, show } from "./dom.js";
import { closeDrawer } from "./drawer.js";
import { S, TEAM_KEY, TOKEN_KEY } from "./state.js";
import { closeStream, openTeam } from "./team.js";

export function signinError(text) {
  const el = $("signin-error");
  el.textContent = text || "";
  show(el, Boolean(text));
}

export async function signIn(token, { quiet = false } = {}) {
  S.token = token;
  let me;
  try {
    me = await api("/v1/me");
  } catch (err) {
    S.token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    if (!quiet || err.status !== 401) {
      signinError(
        err.status === 401
          ? "That token is not valid for this hub. Check that you copied the whole token, and that it belongs to this hub."
          : err.message,
      );
    } else {
      signinError("Your saved token is no longer valid for this hub. Sign in again.");
    }
    return false;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  S.me = me;
  signinError("");
  $("token-input").value = "";
  show($("signin-view"), false);
  show($("sign-out"), true);
  const who = $("whoami");
  clear(who);
  who.append(
    me.admin
      ? h("span", { class: "badge admin", text: "admin" })
      : h("span", {}, h("b", { text: me.name }), h("span", { class: "muted", text: ` · ${me.kind}` })),
  );
  show(who, true);
  show($("team-area"), true);
  if (me.admin) {
    const teams = [];
    try {
      // every team, a bounded page at a time
      let after = null;
      do {
        const q = after === null ? "" : `&after=${encodeURIComponent(after)}`;
        const page = await api(`/v1/teams?limit=1000${q}`);
        teams.push(...page.teams);
        after = page.next_after;
      } while (after !== null && after !== undefined);
    } catch (err) {
      signOut(err.message);
      return false;
    }
    const picker = $("team-picker");
    clear(picker);
    for (const t of teams) picker.append(h("option", { value: t.name, text: t.name }));
    show($("team-picker-label"), true);
    show($("team-name"), false);
    show($("remove-team"), teams.length > 0);
    if (!teams.length) {
      show($("no-teams"), true);
      return true;
    }
    const saved = sessionStorage.getItem(TEAM_KEY);
    const pick = teams.some((t) => t.name === saved) ? saved : teams[0].name;
    picker.value = pick;
    openTeam(pick);
  } else {
    show($("team-picker-label"), false);
    const tn = $("team-name");
    tn.textContent = me.team;
    show(tn, true);
    openTeam(me.team);
  }
  return true;
}

export function signOut(message) {
  S.gen += 1;
  closeStream();
  S.token = null;
  S.me = null;
  S.team = null;
  sessionStorage.removeItem(TOKEN_KEY);
  sessionStorage.removeItem(TEAM_KEY);
  closeDrawer();
  for (const id of ["app-view", "team-area", "whoami", "sign-out", "conn", "no-teams", "remove-team", "admin-note"]) show($(id), false);
  show($("signin-view"), true);
  signinError(message || "");
  $("token-input").focus();
}
