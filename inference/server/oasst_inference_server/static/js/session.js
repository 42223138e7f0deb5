// The sign-in: the access and refresh tokens in localStorage, and their rotation.
//
// The access token is short-lived; before it runs out (or when the server refuses it) the refresh
// token is exchanged for a new pair. The server uses a refresh token up on first use and treats a
// second use as theft, signing the whole family out. So refreshes are serialised across every tab of
// the page (Web Locks), and a tab that waited re-reads the storage: if another tab has rotated
// meanwhile, it takes the new pair instead of presenting the used token again.

import { apiErrorFrom, NetworkError, SessionExpired } from "./errors.js";

const STORAGE_KEY = "oasst.session";
const EARLY_REFRESH_SECONDS = 30;

export function loadTokens() {
  try {
    const tokens = JSON.parse(localStorage.getItem(STORAGE_KEY) || "null");
    return tokens && typeof tokens.access === "string" ? tokens : null;
  } catch {
    return null;
  }
}

/** Keep a LoginResponse ({access_token: {access_token}, refresh_token: {access_token}}). */
export function saveLogin(login) {
  const tokens = { access: login.access_token.access_token, refresh: login.refresh_token?.access_token || null };
  localStorage.setItem(STORAGE_KEY, JSON.stringify(tokens));
  return tokens;
}

export function clearTokens() {
  localStorage.removeItem(STORAGE_KEY);
}

/** Seconds since the epoch at which a JWT expires; 0 when it cannot be read (so it is refreshed). */
function expiresAt(jwt) {
  try {
    const payload = jwt.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const exp = JSON.parse(atob(payload)).exp;
    return typeof exp === "number" ? exp : 0;
  } catch {
    return 0;
  }
}

/** A usable access token, refreshed first when it is about to expire. */
export async function accessToken() {
  const tokens = loadTokens();
  if (!tokens) throw new SessionExpired("not signed in");
  if (expiresAt(tokens.access) - Date.now() / 1000 > EARLY_REFRESH_SECONDS) return tokens.access;
  return (await refresh(tokens.access)).access;
}

function withRefreshLock(task) {
  if (navigator.locks) return navigator.locks.request("oasst-token-refresh", task);
  return task();
}

/** Rotate the tokens, unless the access token is no longer ``staleAccess`` (rotated meanwhile). */
export function refresh(staleAccess) {
  return withRefreshLock(async () => {
    const current = loadTokens();
    if (!current) throw new SessionExpired("signed out");
    if (current.access !== staleAccess) return current;
    if (!current.refresh) {
      clearTokens();
      throw new SessionExpired("the sign-in has no refresh token");
    }
    let response;
    try {
      response = await fetch("/auth/refresh", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ refresh_token: current.refresh }),
      });
    } catch (error) {
      throw new NetworkError(error.message);
    }
    if (response.status === 401 || response.status === 422) {
      clearTokens();
      throw new SessionExpired((await apiErrorFrom(response)).message);
    }
    if (!response.ok) throw await apiErrorFrom(response); // server trouble: stay signed in
    return saveLogin(await response.json());
  });
}

/** Sign out here and revoke the sign-in on the server (its refresh-token family). */
export async function signOut() {
  const tokens = loadTokens();
  clearTokens();
  if (tokens?.refresh) {
    await fetch("/auth/logout", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ refresh_token: tokens.refresh }),
    }).catch(() => {}); // offline: the tokens are gone from this browser all the same
  }
}
