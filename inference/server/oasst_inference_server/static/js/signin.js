// The sign-in screen: a button per OAuth provider the server has configured (/auth/providers), and
// the development sign-in only where the server offers it ("debug").

import { publicGet } from "./api.js";
import { $, h, showScreen } from "./dom.js";
import { describeError } from "./errors.js";
import { saveLogin } from "./session.js";

const PROVIDER_LABELS = { github: "GitHub", discord: "Discord" };
export const SIGNIN_ERROR_KEY = "oasst.signinError"; // left by the OAuth hand-off page

/** Show the sign-in screen; resolves once the user has signed in with the development sign-in
 * (OAuth sign-ins leave the page and come back through signin-handoff.js). */
export async function signIn(notice = "") {
  showScreen("signin");
  const handoffError = sessionStorage.getItem(SIGNIN_ERROR_KEY);
  sessionStorage.removeItem(SIGNIN_ERROR_KEY);
  const message = handoffError ? `Sign-in failed: ${handoffError}` : notice;
  $("signin-notice").textContent = message;
  $("signin-notice").hidden = !message;
  let providers = [];
  try {
    providers = await publicGet("/auth/providers");
  } catch (error) {
    $("signin-notice").textContent = describeError(error);
    $("signin-notice").hidden = false;
  }
  const oauth = providers.filter((p) => p !== "debug");
  $("signin-providers").replaceChildren(
    ...oauth.map((name) =>
      h("a", { href: `/auth/login/${encodeURIComponent(name)}?web=true` }, `Continue with ${PROVIDER_LABELS[name] || name}`),
    ),
  );
  const form = $("dev-signin");
  form.hidden = !providers.includes("debug");
  $("signin-none").hidden = providers.length > 0;
  (oauth.length ? $("signin-providers").querySelector("a") : $("dev-username")).focus();
  return new Promise((resolve) => {
    form.onsubmit = async (event) => {
      event.preventDefault();
      const name = $("dev-username").value.trim();
      try {
        saveLogin(await publicGet(`/auth/callback/debug?code=${encodeURIComponent(name)}`));
        resolve();
      } catch (error) {
        $("signin-notice").textContent = describeError(error);
        $("signin-notice").hidden = false;
      }
    };
  });
}
