// The server's REST API (docs/api.md), with the bearer token added and refreshed transparently.

import { apiErrorFrom, NetworkError, SessionExpired } from "./errors.js";
import { accessToken, clearTokens, refresh } from "./session.js";

let sessionExpired = () => {};

/** Called once the sign-in is over (the refresh token was refused): the page shows the sign-in. */
export function onSessionExpired(handler) {
  sessionExpired = handler;
}

async function send(path, options) {
  try {
    return await fetch(path, options);
  } catch (error) {
    if (options.signal?.aborted) throw error;
    throw new NetworkError(error.message);
  }
}

/**
 * Call the API as the signed-in user. JSON in and out; ``raw`` returns the Response (event streams).
 * A 401 is answered by one refresh and one retry: the access token may have been revoked or have
 * expired while the request was on its way.
 */
export async function request(path, { method = "GET", body, signal, headers = {}, raw = false } = {}) {
  try {
    for (let attempt = 0; ; attempt++) {
      const token = await accessToken();
      const allHeaders = { ...headers, Authorization: `Bearer ${token}` };
      if (body !== undefined) allHeaders["Content-Type"] = "application/json";
      const response = await send(path, {
        method,
        signal,
        headers: allHeaders,
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      if (response.status === 401 && attempt === 0) {
        await refresh(token);
        continue;
      }
      if (response.status === 401) {
        clearTokens();
        throw new SessionExpired("the server refused the sign-in");
      }
      if (!response.ok) throw await apiErrorFrom(response);
      if (raw) return response;
      return response.status === 204 ? null : await response.json();
    }
  } catch (error) {
    if (error instanceof SessionExpired) sessionExpired(error);
    throw error;
  }
}

/** A route that needs no sign-in. */
export async function publicGet(path) {
  const response = await send(path, {});
  if (!response.ok) throw await apiErrorFrom(response);
  return response.json();
}

export const api = {
  get: (path, options) => request(path, options),
  post: (path, body = {}, options) => request(path, { ...options, method: "POST", body }),
  put: (path, body, options) => request(path, { ...options, method: "PUT", body }),
  delete: (path, options) => request(path, { ...options, method: "DELETE" }),
};
