// The open team: its first snapshot, then the live stream (snapshots and traffic) with
// a fresh one-minute ticket on every (re)connect. The stream replays only the team's
// latest events (as many as the timeline keeps), then goes live.

import { api, teamPath } from "./api.js";
import { $, show } from "./dom.js";
import { closeDrawer, refreshDrawer } from "./drawer.js";
import { refreshPanel } from "./panels.js";
import { signOut } from "./signin.js";
import { S, TEAM_KEY } from "./state.js";
import { setHubNow } from "./time.js";
import { MAX_ROWS, applyTraffic, renderCount, resetTimeline } from "./timeline.js";
import { render, renderAll } from "./views.js";

function resetTeam() {
  S.cursor = 0;
  S.live = false;
  resetTimeline();
  S.dead = [];
  S.members = [];
  S.links = [];
  S.timers = [];
  S.delegations = [];
  S.budgets = [];
  S.tally = {};
  S.hidden = {};
  S.pageSize = {};
  S.filter = { member: "", kind: "" };
  $("filter-member").value = "";
  $("filter-kind").value = "";
  closeDrawer();
}

export async function openTeam(team) {
  S.gen += 1;
  const gen = S.gen;
  closeStream();
  resetTeam();
  setConn("connecting", "connecting…");
  S.retry = 0;
  S.team = team;
  sessionStorage.setItem(TEAM_KEY, team);
  show($("no-teams"), false);
  show($("app-view"), true);
  const canSend = S.me.admin || S.me.name === "user";
  show($("composer"), canSend);
  show($("composer-off"), !canSend);
  renderAll();
  try {
    const snap = await api(teamPath("/snapshot"));
    if (gen !== S.gen) return;
    applySnapshot(snap);
  } catch (err) {
    if (gen !== S.gen) return;
    if (err.status === 401) return signOut("Your token is no longer valid for this hub. Sign in again.");
    setConn("error", err.message);
  }
  connect(gen);
}

function setConn(state, text) {
  const el = $("conn");
  el.dataset.state = state;
  $("conn-text").textContent = text;
  el.title = text;
  show(el, true);
}

export function closeStream() {
  if (S.es) {
    S.es.close();
    S.es = null;
  }
}

async function connect(gen) {
  if (gen !== S.gen) return;
  setConn("connecting", S.live ? "reconnecting…" : "connecting…");
  let ticket;
  try {
    ({ ticket } = await api("/v1/dashboard/tickets", { method: "POST", body: { team: S.team } }));
  } catch (err) {
    if (gen !== S.gen) return;
    if (err.status === 401) return signOut("Your token is no longer valid for this hub. Sign in again.");
    return retryLater(gen, err.message);
  }
  if (gen !== S.gen) return;
  // only the latest events the timeline can keep, whatever the length of the history
  const url = `${teamPath("/stream")}?ticket=${encodeURIComponent(ticket)}&after=${S.cursor}&last=${MAX_ROWS}`;
  const es = new EventSource(url);
  S.es = es;
  es.addEventListener("open", () => {
    if (gen !== S.gen) return;
    S.retry = 0;
    setConn(S.live ? "live" : "connecting", S.live ? "live" : "loading history…");
  });
  es.addEventListener("replay", (ev) => {
    if (gen !== S.gen) return;
    const { after } = JSON.parse(ev.data);
    // resuming past events this page never saw: what it built from traffic is stale
    if (S.cursor > 0 && after > S.cursor) {
      resetTimeline();
      render("members", "count");
    }
    // a replay that starts after the team's first events leaves older messages out
    if (after > S.cursor) S.older = true;
    S.cursor = Math.max(S.cursor, after);
  });
  es.addEventListener("snapshot", (ev) => gen === S.gen && applySnapshot(JSON.parse(ev.data)));
  es.addEventListener("traffic", (ev) => gen === S.gen && applyTraffic(JSON.parse(ev.data)));
  es.addEventListener("live", () => {
    if (gen !== S.gen) return;
    S.live = true;
    setConn("live", "live");
    renderCount();
  });
  es.addEventListener("error", () => {
    // the browser would retry with the same (soon expired) ticket: take over instead
    es.close();
    if (gen !== S.gen || S.es !== es) return;
    S.es = null;
    retryLater(gen, "connection lost");
  });
}

function retryLater(gen, why) {
  const delay = Math.min(500 * 2 ** S.retry, 8000);
  S.retry += 1;
  if (S.retry === 1) setConn("connecting", "reconnecting…");
  else setConn("down", `${why}; retrying in ${Math.round(delay / 1000) || 1} s`);
  setTimeout(() => connect(gen), delay);
}

export function applySnapshot(snap) {
  S.members = snap.members || [];
  S.links = snap.links || [];
  S.timers = snap.timers || [];
  S.delegations = snap.delegations || [];
  S.budgets = snap.budgets || [];
  S.dead = snap.dead || [];
  S.tally = snap.delegation_tally || {};
  S.hidden = snap.hidden || {};
  // panels where more pages were asked for are read again at that size
  for (const kind of Object.keys(S.pageSize)) refreshPanel(kind);
  if (typeof snap.now === "number") setHubNow(snap.now);
  render("members", "memberOptions", "links", "timers", "delegations", "budgets", "dead");
  if (S.drawer && S.drawer.type === "session") refreshDrawer();
}

