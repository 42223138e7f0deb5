// The end of an OAuth sign-in that the chat page started: the server's callback answered with this
// page and the token pair (or an error) in a JSON script element. Keep it, and go back to the chat.

import { saveLogin } from "./session.js";
import { SIGNIN_ERROR_KEY } from "./signin.js";

const result = JSON.parse(document.getElementById("signin-result").textContent);
if (result.tokens) saveLogin(result.tokens);
else sessionStorage.setItem(SIGNIN_ERROR_KEY, result.error || "the provider did not sign you in");
window.location.replace("/");
