// What can go wrong talking to the server, and how each failure is put to the user.

/** The server answered with an error: {detail, code} and, for 429 and 503, Retry-After. */
export class ApiError extends Error {
  constructor(status, code, detail, retryAfter = null) {
    super(detail || `the server answered ${status}`);
    this.status = status;
    this.code = code || "";
    this.retryAfter = retryAfter;
  }
}

/** The server could not be reached at all (offline, server down, connection cut). */
export class NetworkError extends Error {}

/** The sign-in is over: the refresh token was refused (expired, revoked, or signed out elsewhere). */
export class SessionExpired extends Error {}

export async function apiErrorFrom(response) {
  let body = {};
  try {
    body = await response.json();
  } catch {
    // not JSON (a proxy's error page): the status says enough
  }
  const retry = Number.parseInt(response.headers.get("Retry-After") || "", 10);
  return new ApiError(response.status, body.code, body.detail, Number.isFinite(retry) ? retry : null);
}

// Refusals of the prompt itself (its text, its place in the chat): the user changes the prompt, so the
// page keeps it in the message box. Other refusals of a turn are about its answer (limits, model,
// workers): shown where the answer would be, with a retry.
const PROMPT_ERRORS = new Set([
  "empty_message",
  "message_too_long",
  "chat_full",
  "parent_required",
  "parent_not_found",
  "parent_not_assistant",
  "parent_not_complete",
]);

/** Whether the server refused a turn for its prompt rather than for its answer. */
export function refusesPrompt(error) {
  return error instanceof ApiError && (error.status === 404 || PROMPT_ERRORS.has(error.code));
}

function seconds(n) {
  if (n === null || n === undefined) return "a moment";
  return n < 90 ? `${n} s` : `${Math.ceil(n / 60)} min`;
}

/** One sentence a person can act on, for any error the page meets. */
export function describeError(error, { model } = {}) {
  if (error instanceof NetworkError || error instanceof TypeError) {
    return "Can't reach the server. Check your connection and try again.";
  }
  if (error instanceof SessionExpired) return "Your session has expired. Sign in again.";
  if (!(error instanceof ApiError)) return `Something went wrong: ${error.message || error}`;
  switch (error.code) {
    case "rate_limited":
      return `You have reached the limit of answers per minute. Try again in ${seconds(error.retryAfter)}.`;
    case "too_many_concurrent_generations":
      return "Several of your answers are still being written. Wait for one to finish, then try again.";
    case "no_worker":
      return `No worker is serving ${model || "this model"} right now. Pick another model or try again later.`;
    case "queue_full":
      return `The queue for ${model || "this model"} is full. Try again in ${seconds(error.retryAfter)}.`;
    case "unknown_model":
      return `${model || "This model"} is not available any more. Pick another model.`;
    case "chat_full":
      return "This chat has reached its message limit. Start a new chat to go on.";
    case "message_too_long":
      return `Your message is too long. ${error.message}`;
    case "parent_not_complete":
      return "Wait for the answer above to finish before replying.";
    default:
      break;
  }
  if (error.status === 429) return `Too many requests. Try again in ${seconds(error.retryAfter)}.`;
  if (error.status === 503) return `The service is busy or unavailable. Try again in ${seconds(error.retryAfter)}.`;
  if (error.status === 404) return "That chat or message no longer exists.";
  if (error.status >= 500) return `The server had a problem (${error.status}). Try again.`;
  return error.message;
}
