// backchannel dashboard: plain JavaScript modules, no framework, no build step, no
// network beyond this hub. Every piece of hub data is written with textContent, never as
// HTML (see js/dom.js). This entry module names the page's views and wires its controls;
// each part of the page is a module in js/. Modules only define functions when they load
// (nothing runs at import time but here), so the one import cycle, sign-in <-> the open
// team, is harmless.

import { removeTeam } from "./js/admin.js";
import { renderBudgets } from "./js/budgets.js";
import { compose } from "./js/compose.js";
import { renderDead } from "./js/dead.js";
import { renderDelegations } from "./js/delegations.js";
import { $ } from "./js/dom.js";
import { closeDrawer, refreshDrawer } from "./js/drawer.js";
import { renderLinks } from "./js/links.js";
import { renderMemberOptions, renderMembers } from "./js/members.js";
import { signIn, signinError, signOut } from "./js/signin.js";
import { S, TOKEN_KEY } from "./js/state.js";
import { openTeam } from "./js/team.js";
import { loadTheme, toggleTheme } from "./js/theme.js";
import { tick } from "./js/time.js";
import { clearFilters, renderCount, setKindFilter, setMemberFilter } from "./js/timeline.js";
import { renderTimers } from "./js/timers.js";
import { defineViews, watchPresses } from "./js/views.js";

const ACTIVE_SESSION_REFRESH_MS = 2000;

// Every view by name, in the order a full redraw draws them.
defineViews({
  members: renderMembers,
  memberOptions: renderMemberOptions,
  links: renderLinks,
  timers: renderTimers,
  delegations: renderDelegations,
  budgets: renderBudgets,
  dead: renderDead,
  count: renderCount,
});

function init() {
  loadTheme();
  watchPresses(document);
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
  $("filter-kind").addEventListener("change", (e) => setKindFilter(e.target.value));
  $("filter-clear").addEventListener("click", clearFilters);
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

// a module runs once the document is parsed; the check keeps init safe either way
if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
else init();
