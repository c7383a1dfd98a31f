// The hub's API, with the signed-in token as `Authorization: Bearer`.

import { S } from "./state.js";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export async function api(path, options = {}) {
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

// A path under the open team's dashboard endpoints.
export const teamPath = (rest) => `/v1/dashboard/teams/${encodeURIComponent(S.team)}${rest}`;
