// The composer: send as `user`, with a message id of the page's own, reused when the
// same message is sent again, so a retry is idempotent.

import { api, teamPath } from "./api.js";
import { $ } from "./dom.js";

function newMessageId() {
  const bytes = new Uint8Array(12);
  crypto.getRandomValues(bytes);
  return `dash-${[...bytes].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
}

let composing = null; // {id, to, text, summary}: reused on a retry so a resend is idempotent

export async function compose(e) {
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
