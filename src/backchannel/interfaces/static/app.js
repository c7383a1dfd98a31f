// backchannel dashboard: plain JavaScript, no framework, no build step, no network
// beyond this hub. Every piece of hub data is written with textContent, never as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "backchannel.token";
  const TEAM_KEY = "backchannel.team";
  const THEME_KEY = "backchannel.theme";
  const MAX_ROWS = 1000;
  const ACTIVE_SESSION_REFRESH_MS = 2000;
  const STATE_OF_EVENT = {
    queued: "queued",
    lease_expired: "queued",
    released: "queued",
    leased: "leased",
    delivered: "delivered",
    acked: "acked",
    dead: "dead",
  };
  const STATE_ORDER = ["queued", "leased", "delivered", "acked", "dead"];

  // -- tiny DOM helpers --------------------------------------------------------------
  const $ = (id) => document.getElementById(id);

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "dataset") Object.assign(el.dataset, v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  function show(el, visible) {
    el.hidden = !visible;
  }

  function clear(el) {
    while (el.firstChild) el.removeChild(el.firstChild);
  }

  // -- time ----------------------------------------------------------------------------
  const pad = (n) => String(n).padStart(2, "0");

  function clock(ts) {
    if (ts === null || ts === undefined) return "";
    const d = new Date(ts * 1000);
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function fullTime(ts) {
    return ts ? new Date(ts * 1000).toLocaleString() : "";
  }

  function span(seconds) {
    const s = Math.abs(seconds);
    if (s < 1) return "now";
    if (s < 60) return `${Math.floor(s)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min`;
    if (s < 86400) return `${Math.floor(s / 3600)} h`;
    return `${Math.floor(s / 86400)} d`;
  }

  // The hub's clock, as far as this page can tell (each snapshot says what time it is there).
  let skew = 0;
  const hubNow = () => Date.now() / 1000 + skew;

  function ago(ts) {
    if (!ts) return "never";
    const d = hubNow() - ts;
    return d < 1 ? "just now" : `${span(d)} ago`;
  }

  function dueIn(ts) {
    if (!ts) return "";
    const d = ts - hubNow();
    return d >= 0 ? `due in ${span(d)}` : `overdue ${span(d)}`;
  }

  // Elements whose text depends on the time carry data-ago / data-due; one ticker updates them.
  function relTime(ts, mode) {
    const el = h("span", { class: "reltime", title: fullTime(ts) });
    if (mode === "due") el.dataset.due = ts ?? "";
    else el.dataset.ago = ts ?? "";
    el.textContent = mode === "due" ? dueIn(ts) : ago(ts);
    return el;
  }

  function tick() {
    for (const el of document.querySelectorAll("[data-ago]")) {
      el.textContent = ago(Number(el.dataset.ago) || null);
    }
    for (const el of document.querySelectorAll("[data-due]")) {
      el.textContent = dueIn(Number(el.dataset.due) || null);
    }
  }

  // -- state ---------------------------------------------------------------------------
  const S = {
    token: null,
    me: null, // {admin, team, name, kind}
    team: null,
    gen: 0, // bumps on every team switch / sign-out; stale callbacks check it
    es: null,
    retry: 0,
    cursor: 0,
    live: false,
    messages: new Map(), // id -> {id, from, kind, summary, at, to: Map(member -> state), events: []}
    rows: new Map(), // id -> row element
    members: [],
    activity: new Map(), // member -> latest timestamp seen in traffic
    links: [],
    timers: [],
    delegations: [],
    budgets: [],
    tally: {}, // delegation state -> how many (all of them, also those not listed)
    hidden: {}, // panel -> how many records the snapshot (or the loaded pages) left out
    pageSize: {}, // panel -> how many records the page asked for (beyond the snapshot's)
    dead: new Map(), // `${id}|${to}` -> {id, to, from, reason, at, summary}
    filter: { member: "", kind: "" },
    drawer: null, // {type: "message", id} | {type: "session", id}
  };

  // -- API -------------------------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(path, options = {}) {
    const headers = { Authorization: `Bearer ${S.token}` };
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    let resp;
    try {
      resp = await fetch(path, {
        method: options.method || "GET",
        headers,
        body: options.body === undefined ? undefined : JSON.stringify(options.body),
        cache: "no-store",
      });
    } catch (err) {
      throw new ApiError(0, "network", "Cannot reach the hub. Is `backchannel serve` running?");
    }
    let data = null;
    try {
      data = await resp.json();
    } catch (err) {
      data = null;
    }
    if (!resp.ok) {
      const e = (data && data.error) || {};
      throw new ApiError(resp.status, e.code || "http_error", e.message || `HTTP ${resp.status}`);
    }
    return data;
  }

  const teamPath = (rest) => `/v1/dashboard/teams/${encodeURIComponent(S.team)}${rest}`;

  // -- sign-in ---------------------------------------------------------------------------
  function signinError(text) {
    const el = $("signin-error");
    el.textContent = text || "";
    show(el, Boolean(text));
  }

  async function signIn(token, { quiet = false } = {}) {
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
      let teams;
      try {
        ({ teams } = await api("/v1/teams"));
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

  function signOut(message) {
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

  // -- a team ----------------------------------------------------------------------------
  function resetTeam() {
    S.cursor = 0;
    S.live = false;
    S.messages.clear();
    S.rows.clear();
    S.activity.clear();
    S.dead.clear();
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
    clear($("timeline"));
    closeDrawer();
  }

  async function openTeam(team) {
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

  // -- the stream ------------------------------------------------------------------------
  function setConn(state, text) {
    const el = $("conn");
    el.dataset.state = state;
    $("conn-text").textContent = text;
    el.title = text;
    show(el, true);
  }

  function closeStream() {
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
    const url = `${teamPath("/stream")}?ticket=${encodeURIComponent(ticket)}&after=${S.cursor}`;
    const es = new EventSource(url);
    S.es = es;
    es.addEventListener("open", () => {
      if (gen !== S.gen) return;
      S.retry = 0;
      setConn(S.live ? "live" : "connecting", S.live ? "live" : "loading history…");
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

  // -- applying data -----------------------------------------------------------------------
  function applySnapshot(snap) {
    S.members = snap.members || [];
    S.links = snap.links || [];
    S.timers = snap.timers || [];
    S.delegations = snap.delegations || [];
    S.budgets = snap.budgets || [];
    S.tally = snap.delegation_tally || {};
    S.hidden = snap.hidden || {};
    // panels where more pages were asked for are read again at that size
    for (const kind of Object.keys(S.pageSize)) refreshPanel(kind);
    if (typeof snap.now === "number") skew = snap.now - Date.now() / 1000;
    renderMembers();
    renderMemberOptions();
    renderLinks();
    renderTimers();
    renderDelegations();
    renderBudgets();
    if (S.drawer && S.drawer.type === "session") refreshDrawer();
  }

  function touch(member, at) {
    if (!member || !at) return;
    if ((S.activity.get(member) || 0) < at) S.activity.set(member, at);
  }

  function applyTraffic(ev) {
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
    if (ev.event === "dead") {
      S.dead.set(`${msg.id}|${ev.to}`, {
        id: msg.id,
        to: ev.to,
        from: msg.from,
        reason: ev.detail || "no reason given",
        at: ev.at,
        summary: msg.summary,
      });
      scheduleRender("dead");
    }
    updateRow(msg);
    scheduleRender("members");
    if (S.drawer && S.drawer.type === "message" && S.drawer.id === msg.id) refreshDrawer();
  }

  // Renders that many events may trigger are batched into one animation frame.
  const pendingRenders = new Set();
  let frameQueued = false;
  function scheduleRender(what) {
    pendingRenders.add(what);
    if (frameQueued) return;
    frameQueued = true;
    requestAnimationFrame(() => {
      frameQueued = false;
      const todo = [...pendingRenders];
      pendingRenders.clear();
      if (todo.includes("members")) renderMembers();
      if (todo.includes("dead")) renderDead();
      if (todo.includes("count")) renderCount();
    });
  }

  // -- timeline ----------------------------------------------------------------------------
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

  function stateChip(state) {
    return h("span", { class: `state state-${state}`, text: state });
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
    renderMembers();
    renderCount();
  }

  function renderCount() {
    const total = S.rows.size;
    let shown = 0;
    for (const row of S.rows.values()) if (!row.hidden) shown += 1;
    const filtered = S.filter.member || S.filter.kind;
    $("timeline-count").textContent = filtered ? `${shown} of ${total}` : total ? `${total} messages` : "";
    const empty = $("timeline-empty");
    empty.textContent = total ? "no messages match these filters" : S.live ? "no messages yet" : "loading…";
    show(empty, shown === 0);
  }

  // -- members ------------------------------------------------------------------------------
  function lastActivity(m) {
    return Math.max(m.last_activity || 0, S.activity.get(m.name) || 0) || null;
  }

  function renderMembers() {
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

  // -- admin actions: a new token, removing a member or the team -----------------------------
  function adminNote(text, isError = false) {
    const note = $("admin-note");
    clear(note);
    note.append(h("span", { class: isError ? "error" : "", text }));
    show(note, true);
  }

  function memberActions(name) {
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

  async function removeTeam() {
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

  function renderMemberOptions() {
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

  function setMemberFilter(name) {
    S.filter.member = name;
    $("filter-member").value = name;
    applyFilters();
  }

  // -- side panels --------------------------------------------------------------------------
  // The records are the hub's own JSON (Link, Timer and Delegation .to_json()).
  // Snapshots carry the first page of each panel; "show more" reads bigger pages.
  const PAGE = 50;

  async function refreshPanel(kind) {
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
    ({ links: renderLinks, timers: renderTimers, delegations: renderDelegations })[kind]();
  }

  function showMore(kind) {
    S.pageSize[kind] = Math.min((S.pageSize[kind] || PAGE) + PAGE * 2, 500);
    refreshPanel(kind);
  }

  function panelList(name, items, render, hidden = 0, total = items.length) {
    const list = $(name);
    clear(list);
    for (const item of items) list.append(render(item));
    if (hidden > 0) {
      const more = (S.pageSize[name] || PAGE) < 500;
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

  function sessionButton(sid, fallback) {
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

  function meter(pct, title) {
    const fill = h("div", { class: "meter-fill" });
    fill.style.width = `${pct}%`; // CSSOM, which the page's CSP allows (style attributes it does not)
    return h("div", { class: "meter", title }, fill);
  }

  // Why a link closed, in words (the hub's close_reason codes).
  function closeReason(l) {
    switch (l.close_reason) {
      case "budget_exhausted":
        return `its ${l.budget} turns are used up`;
      case "closed_by_initiator":
        return `${l.initiator}, who opened it, closed it`;
      case "session_terminated":
        return "a session on it was terminated";
      case "conversation_budget":
        return "the conversation budget between them is spent";
      default:
        return l.close_reason ? String(l.close_reason).replaceAll("_", " ") : "no reason given";
    }
  }

  function linkItem(l) {
    const used = Number(l.turns_used) || 0;
    const budget = Number(l.budget) || 0;
    const pct = budget ? Math.min(100, Math.round((used / budget) * 100)) : 0;
    return h(
      "li",
      {
        class: `item link link-${l.state}`,
        title: `opened by ${l.initiator} ${ago(l.created_at)}`,
        dataset: { linkId: l.link_id, state: l.state },
      },
      h(
        "div",
        { class: "item-line" },
        h(
          "span",
          { class: "peers" },
          h("b", { text: l.initiator }),
          h("span", { class: "muted", text: " ↔ " }),
          h("b", { text: l.responder }),
        ),
        h("span", { class: `pill pill-${l.state}`, text: l.state }),
      ),
      h(
        "div",
        { class: "item-line small link-sessions" },
        sessionButton(l.initiator_session, "?"),
        h("span", { class: "muted", text: "↔" }),
        sessionButton(l.responder_session, "no session yet"),
      ),
      h(
        "div",
        { class: "item-line" },
        meter(pct, `${used} of ${budget} turns used`),
        h("span", { class: "turns mono", title: `${used} of ${budget} turns used`, text: `${used}/${budget}` }),
        h("span", { class: "muted small", text: "turns" }),
      ),
      l.state === "closed"
        ? h("div", { class: "why small", title: l.close_reason || "", dataset: { reason: l.close_reason || "" } }, `closed: ${closeReason(l)}`)
        : null,
    );
  }

  function renderLinks() {
    panelList("links", S.links, linkItem, S.hidden.links || 0, S.links.length + (S.hidden.links || 0));
  }

  function timerItem(t) {
    const intent = String(t.intent || "timer");
    return h(
      "li",
      { class: "item timer", dataset: { timerId: String(t.timer_id), state: t.state } },
      h(
        "div",
        { class: "item-line" },
        h("span", { class: `intent intent-${intent}`, text: intent.toUpperCase() }),
        h("b", { class: "owner", text: t.member }),
        t.target ? h("span", { class: "target muted", text: `→ ${t.target}` }) : null,
        h("span", { class: "spacer" }),
        t.state === "pending"
          ? relTime(t.due_at, "due")
          : h("span", { class: `pill pill-${t.state}`, text: t.state }),
      ),
      h("div", { class: "note", title: t.note, text: t.note }),
      h("div", { class: "item-line small" }, h("span", { class: "muted", text: "on" }), sessionButton(t.session, "?")),
    );
  }

  function renderTimers() {
    const timers = [...S.timers].sort((x, y) => x.due_at - y.due_at);
    const hidden = S.hidden.timers || 0;
    panelList("timers", timers, timerItem, hidden, timers.length + hidden);
  }

  // Conversation budgets (per pair and per chain): spent ones first, each with its extend action.
  function budgetItem(b) {
    const used = Number(b.used) || 0;
    const limit = Number(b.limit) || 0;
    const pct = limit ? Math.min(100, Math.round((used / limit) * 100)) : 0;
    const who = b.scope === "pair" ? (b.members || []).join(" ↔ ") : `chain ${String(b.key).slice(6)}`;
    const by = h("input", { type: "number", min: "1", max: "1000", value: "4", class: "extend-by", title: "how many more" });
    const button = h("button", {
      type: "button",
      class: "extend",
      text: "extend",
      title: `let this many more ${b.scope === "pair" ? "exchanges" : "hops"} through`,
      onclick: () => extendBudget(b.key, Number(by.value), button),
    });
    return h(
      "li",
      { class: `item budget ${b.spent ? "budget-spent" : ""}`, dataset: { key: b.key, spent: String(!!b.spent) } },
      h(
        "div",
        { class: "item-line" },
        h("b", { class: "peers", text: who }),
        h("span", { class: "spacer" }),
        b.spent ? h("span", { class: "pill pill-closed", text: "spent" }) : null,
      ),
      h(
        "div",
        { class: "item-line" },
        meter(pct, `${used} of ${limit} used`),
        h("span", { class: "turns mono", text: `${used}/${limit}` }),
        h("span", { class: "muted small", text: b.scope === "pair" ? "exchanges" : "hops" }),
      ),
      b.spent && b.resets_at ? h("div", { class: "small muted" }, "resets ", relTime(b.resets_at, "due")) : null,
      h("div", { class: "item-line small" }, by, button),
    );
  }

  function renderBudgets() {
    const items = [...S.budgets].sort((x, y) => Number(!!y.spent) - Number(!!x.spent) || y.updated_at - x.updated_at);
    panelList("budgets", items, budgetItem);
  }

  async function extendBudget(key, by, button) {
    const status = $("budgets-status");
    status.className = "compose-status";
    button.disabled = true;
    try {
      const r = await api(teamPath("/budgets/extend"), { method: "POST", body: { key, by } });
      status.textContent = `${key}: ${r.used} of ${r.limit} used`;
      status.classList.add("ok");
      const snap = await api(teamPath("/snapshot"));
      applySnapshot(snap);
    } catch (err) {
      status.textContent = err.message;
      status.classList.add("error");
    } finally {
      button.disabled = false;
    }
  }

  const DELEGATION_STATES = ["pending", "answered", "timed_out", "late", "failed"];
  const stateLabel = (st) => String(st).replaceAll("_", " ");
  const firstLine = (text) => String(text || "").trim().split("\n")[0];

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

  function renderDelegations() {
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

  function renderDead() {
    const items = [...S.dead.values()].sort((x, y) => y.at - x.at);
    panelList("dead", items, (d) =>
      h(
        "li",
        { class: "item dead", dataset: { id: d.id } },
        h(
          "button",
          { type: "button", class: "item-button", onclick: () => openMessage(d.id) },
          h(
            "div",
            { class: "item-line" },
            h("b", { text: d.from || "?" }),
            h("span", { class: "muted", text: " → " }),
            h("b", { text: d.to }),
            h("span", { class: "spacer" }),
            relTime(d.at),
          ),
          h("div", { class: "note", text: d.summary || d.id }),
          h("div", { class: "why small", text: d.reason }),
        ),
      ),
    );
  }

  function renderAll() {
    renderMembers();
    renderMemberOptions();
    renderLinks();
    renderTimers();
    renderDelegations();
    renderBudgets();
    renderDead();
    renderCount();
  }

  // -- the drawer: a message, or a session ----------------------------------------------------
  function openDrawer(kind, id) {
    S.drawer = { type: kind, id };
    show($("drawer"), true);
    show($("scrim"), true);
    for (const r of S.rows.values()) r.classList.toggle("open", kind === "message" && r.dataset.id === id);
    refreshDrawer();
  }

  function closeDrawer() {
    S.drawer = null;
    show($("drawer"), false);
    show($("scrim"), false);
    for (const r of S.rows.values()) r.classList.remove("open");
  }

  const openMessage = (id) => openDrawer("message", id);
  const openSession = (id) => openDrawer("session", id);

  let drawerSeq = 0;
  async function refreshDrawer() {
    const d = S.drawer;
    if (!d) return;
    const seq = ++drawerSeq;
    try {
      const path = d.type === "message" ? `/messages/${encodeURIComponent(d.id)}` : `/sessions/${encodeURIComponent(d.id)}`;
      const data = await api(teamPath(path));
      if (seq !== drawerSeq || S.drawer !== d) return;
      if (d.type === "message") renderMessage(data);
      else {
        d.active = data.session.state === "active";
        renderSession(data);
      }
    } catch (err) {
      if (seq !== drawerSeq || S.drawer !== d) return;
      $("drawer-kicker").textContent = d.type;
      $("drawer-title").textContent = d.id;
      const body = $("drawer-body");
      clear(body);
      body.append(h("p", { class: "form-error", text: err.message }));
    }
  }

  function facts(pairs) {
    return h(
      "dl",
      { class: "facts" },
      pairs.filter(([, v]) => v !== null && v !== undefined && v !== "").map(([k, v]) => [h("dt", { text: k }), h("dd", {}, v)]),
    );
  }

  function mono(text) {
    return h("span", { class: "mono", text });
  }

  function renderMessage(m) {
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

  function sessionRecords(title, items, render) {
    if (!items.length) return null;
    return [h("h3", { text: title }), h("ul", { class: "minis" }, items.map(render))];
  }

  function renderSession(data) {
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
    // what the snapshot knows about this session: its links, timers and delegations
    const mine = (...ids) => ids.includes(sid);
    body.append(
      ...[
        sessionRecords("Links", S.links.filter((l) => mine(l.initiator_session, l.responder_session)), (l) => miniLink(l, s.member)),
        sessionRecords("Timers", S.timers.filter((t) => t.session === sid), miniTimer),
        sessionRecords("Delegations", S.delegations.filter((d) => mine(d.caller_session, d.callee_session)), (d) => miniDelegation(d, sid)),
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

  // -- the composer --------------------------------------------------------------------------
  function newMessageId() {
    const bytes = new Uint8Array(12);
    crypto.getRandomValues(bytes);
    return `dash-${[...bytes].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
  }

  let composing = null; // {id, to, text, summary}: reused on a retry so a resend is idempotent

  async function compose(e) {
    e.preventDefault();
    const to = $("compose-to").value;
    const text = $("compose-text").value;
    const summary = $("compose-summary").value.trim() || null;
    const status = $("compose-status");
    status.className = "compose-status";
    if (!text.trim()) {
      status.textContent = "Write something first.";
      status.classList.add("error");
      return;
    }
    if (!composing || composing.to !== to || composing.text !== text || composing.summary !== summary) {
      composing = { id: newMessageId(), to, text, summary };
    }
    const button = $("compose-send");
    button.disabled = true;
    status.textContent = "sending…";
    try {
      const r = await api(teamPath("/messages"), {
        method: "POST",
        body: { to, text, summary, message_id: composing.id },
      });
      composing = null;
      $("compose-text").value = "";
      $("compose-summary").value = "";
      status.textContent = `sent to ${r.recipients.join(", ")}`;
      status.classList.add("ok");
    } catch (err) {
      status.textContent = err.message;
      status.classList.add("error");
    } finally {
      button.disabled = false;
    }
  }

  // -- theme -------------------------------------------------------------------------------------
  function applyTheme(theme) {
    if (theme) document.documentElement.dataset.theme = theme;
    else delete document.documentElement.dataset.theme;
  }

  function toggleTheme() {
    const current =
      document.documentElement.dataset.theme ||
      (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light");
    const next = current === "dark" ? "light" : "dark";
    localStorage.setItem(THEME_KEY, next);
    applyTheme(next);
  }

  // -- wiring ------------------------------------------------------------------------------------
  function init() {
    applyTheme(localStorage.getItem(THEME_KEY));
    $("theme-toggle").addEventListener("click", toggleTheme);
    $("signin-form").addEventListener("submit", async (e) => {
      e.preventDefault();
      const token = $("token-input").value.trim();
      if (!token) return signinError("Paste a token first.");
      const button = $("signin-button");
      button.disabled = true;
      try {
        await signIn(token);
      } finally {
        button.disabled = false;
      }
    });
    $("sign-out").addEventListener("click", () => signOut(""));
    $("team-picker").addEventListener("change", (e) => openTeam(e.target.value));
    $("remove-team").addEventListener("click", removeTeam);
    $("filter-member").addEventListener("change", (e) => setMemberFilter(e.target.value));
    $("filter-kind").addEventListener("change", (e) => {
      S.filter.kind = e.target.value;
      applyFilters();
    });
    $("filter-clear").addEventListener("click", () => {
      S.filter = { member: "", kind: "" };
      $("filter-member").value = "";
      $("filter-kind").value = "";
      applyFilters();
    });
    $("composer").addEventListener("submit", compose);
    $("compose-text").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("composer").requestSubmit();
    });
    $("drawer-close").addEventListener("click", closeDrawer);
    $("scrim").addEventListener("click", closeDrawer);
    document.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && S.drawer) closeDrawer();
    });
    setInterval(tick, 1000);
    // events inside a running turn change no snapshot: an open view of an active
    // session reads its transcript again every few seconds
    setInterval(() => {
      const d = S.drawer;
      if (d && d.type === "session" && d.active && document.visibilityState === "visible") refreshDrawer();
    }, ACTIVE_SESSION_REFRESH_MS);
    const saved = sessionStorage.getItem(TOKEN_KEY);
    if (saved) signIn(saved, { quiet: true });
    else $("token-input").focus();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
