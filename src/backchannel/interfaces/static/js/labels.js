// The hub's states and codes in the page's words.

import { h } from "./dom.js";

// A delivery event -> the state of the copy it leaves.
export const STATE_OF_EVENT = {
  queued: "queued",
  lease_expired: "queued",
  released: "queued",
  leased: "leased",
  delivered: "delivered",
  acked: "acked",
  dead: "dead",
};

export const DELEGATION_STATES = ["pending", "answered", "timed_out", "late", "failed"];

export function stateChip(state) {
  return h("span", { class: `state state-${state}`, text: state });
}

export const stateLabel = (st) => String(st).replaceAll("_", " ");
export const firstLine = (text) => String(text || "").trim().split("\n")[0];

// Why a link closed, in words (the hub's close_reason codes).
export function closeReason(l) {
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
