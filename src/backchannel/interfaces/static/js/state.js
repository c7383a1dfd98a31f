// The page's state: one object, shared by every module, changed in place.

export const TOKEN_KEY = "backchannel.token";
export const TEAM_KEY = "backchannel.team";

export const S = {
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
  older: false, // the team has messages from before the timeline's rows (not replayed, or dropped)
  members: [],
  activity: new Map(), // member -> latest timestamp seen in traffic
  links: [],
  timers: [],
  delegations: [],
  budgets: [],
  tally: {}, // delegation state -> how many (all of them, also those not listed)
  hidden: {}, // panel -> how many records the snapshot (or the loaded pages) left out
  pageSize: {}, // panel -> how many records the page asked for (beyond the snapshot's)
  dead: [], // the latest dead letters (the snapshot's), latest first; hidden.dead counts the rest
  filter: { member: "", kind: "" },
  drawer: null, // {type: "message", id} | {type: "session", id}
};
