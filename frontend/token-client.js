// token-client.js — the browser helper of token-service. No dependencies.
//
// Bundle it (npm install <repo>/frontend, then import "token-service-client"),
// or load it as an ES module from the token service:
//
//   import { TokenClient, isReplayed } from "https://tokens.example.com/static/token-client.js";
//
// or with a script tag, <script type="module" src=".../token-client.js">, which
// also sets window.TokenClient (with the helpers below as static members).
// A bundled copy has no token service URL to guess: pass { baseUrl }.
//
// One *action* is one user intent ("pay for this order"): it holds ONE token,
// fetched lazily, and every request of the action carries it in the
// Idempotency-Token header — a double click, a retry after a network error or
// a 503, all send the same token, so the backend runs the action at most once
// and answers the duplicates with the stored response (Idempotent-Replayed:
// true). A new action fetches a fresh token.
//
// An action's token that expired before any request carried it (the page sat
// open) is replaced by a fresh one on its own: nothing was done with it.

const DEFAULT_HEADER = "Idempotency-Token";
const REPLAYED_HEADER = "Idempotent-Replayed";

/** Base class of every error this module throws. */
export class TokenClientError extends Error {
  constructor(message, { status = 0, code = "", problem = null, response = null, stage = "", cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = new.target.name;
    // "token": getting the token failed, so no request of the action was sent by
    // this call; "request": the action's request itself failed or was refused.
    this.stage = stage;
    this.status = status; // HTTP status, 0 when no response came back
    this.code = code; // the service's stable problem code, e.g. "token_used"
    this.problem = problem; // the parsed problem+json body, when there was one
    this.response = response; // the Response (its body already read into `problem`)
  }
}

/**
 * 409: the token was already used. `code` says how: "token_used" (done by an
 * earlier request), "token_failed" (the first attempt failed for good; the
 * stored error is in `problem.error`) or "token_in_progress" (another request
 * of the same action still runs and did not finish within inProgressWaitMs).
 */
export class DuplicateRequestError extends TokenClientError {
  constructor(message, details = {}) {
    super(message, details);
    this.retryAfterSeconds = details.retryAfterSeconds ?? null;
  }
}

/** 429: too many tokens or requests; try again after `retryAfterSeconds`. */
export class RateLimitedError extends TokenClientError {
  constructor(message, details = {}) {
    super(message, details);
    this.retryAfterSeconds = details.retryAfterSeconds ?? null;
  }
}

/** The network failed on every attempt (the last error is `cause`); `stage` says which request. */
export class NetworkError extends TokenClientError {}

/** True when the backend answered with the stored response of an earlier request. */
export function isReplayed(response) {
  return (response?.headers?.get(REPLAYED_HEADER) ?? "").toLowerCase() === "true";
}

const sleep = (ms, signal) =>
  new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener(
      "abort",
      () => {
        clearTimeout(timer);
        reject(signal.reason);
      },
      { once: true },
    );
  });

const isAbort = (error) => error?.name === "AbortError" || error?.name === "TimeoutError";

async function readProblem(response) {
  try {
    const body = await response.clone().json();
    return body && typeof body === "object" ? body : null;
  } catch {
    return null;
  }
}

// Retry-After is not a CORS-safelisted header: a cross-origin page only sees it
// when the server exposes it, so the problem body's retry_after_seconds counts too.
// Only a number of seconds is read: an HTTP-date (a proxy's) would compare the
// server's clock with this machine's, off by however far the two disagree.
function retryAfterSeconds(response, problem) {
  const header = response.headers.get("Retry-After");
  if (header !== null && header.trim() !== "") {
    const seconds = Number(header);
    if (Number.isFinite(seconds) && seconds >= 0) return seconds;
  }
  const fromBody = Number(problem?.retry_after_seconds);
  return Number.isFinite(fromBody) && fromBody >= 0 ? fromBody : null;
}

// A token's lifetime is the reply's ttl_seconds counted on this clock from when
// the reply arrived, never the reply's expires_at (the server's clock) against
// Date.now() (this machine's).
function monotonicNow() {
  return globalThis.performance?.now() ?? Date.now();
}

function defaultBaseUrl() {
  // Served by the token service at <base>/static/token-client.js.
  try {
    return new URL("../", import.meta.url).href;
  } catch {
    return globalThis.location?.origin ?? "";
  }
}

/**
 * A client of one token service.
 *
 * options:
 *   baseUrl        the token service, default: where this module was loaded from
 *                  (a bundled copy must pass it)
 *   header         the header carrying the token, default "Idempotency-Token"
 *   retries        retries of one request after a network error or a 503,
 *                  always with the same token (default 3)
 *   inProgressWaitMs  how long a request polls (same token) while another request
 *                  of its action holds the token (409 token_in_progress), for the
 *                  stored result (default 10000)
 *   retryDelayMs   first backoff delay, doubled each time, with jitter (default 250)
 *   maxRetryDelayMs  cap on any wait, Retry-After included (default 5000)
 *   expiryMarginMs an unsent token this close to its expiry is replaced (default
 *                  5000, at most a quarter of the token's lifetime)
 *   credentials    fetch credentials for the token service (default "omit")
 *   fetch          the fetch function to use (default globalThis.fetch)
 *   now            the clock, in ms (default performance.now: monotonic, so a
 *                  wall clock set back or forward does not age a token)
 *   onRetry        called as onRetry({attempt, reason, delayMs, stage}) before each
 *                  retry; stage is "token" (asking for a token: no token exists
 *                  yet) or "request" (resending a request with the action's token)
 */
export class TokenClient {
  constructor(options = {}) {
    this.baseUrl = String(options.baseUrl ?? defaultBaseUrl());
    this.header = options.header ?? DEFAULT_HEADER;
    this.retries = options.retries ?? 3;
    this.retryDelayMs = options.retryDelayMs ?? 250;
    this.maxRetryDelayMs = options.maxRetryDelayMs ?? 5000;
    this.inProgressWaitMs = options.inProgressWaitMs ?? 10000;
    this.expiryMarginMs = options.expiryMarginMs ?? 5000;
    this.credentials = options.credentials ?? "omit";
    this.onRetry = options.onRetry ?? null;
    this.now = options.now ?? monotonicNow;
    const fetchImpl = options.fetch ?? globalThis.fetch;
    this._fetch = (...args) => fetchImpl.apply(globalThis, args);
  }

  /**
   * Ask the service for a one-time token (POST /token/generate).
   * options: subject, fingerprint, ttlSeconds, signal.
   * Resolves to the service's JSON: {token, scope, subject, fingerprint, ttl_seconds, expires_at}.
   */
  async getToken(scope, options = {}) {
    const body = { scope };
    if (options.subject != null) body.subject = options.subject;
    if (options.fingerprint != null) body.fingerprint = options.fingerprint;
    if (options.ttlSeconds != null) body.ttl_seconds = options.ttlSeconds;
    const url = new URL("token/generate", this.baseUrl.endsWith("/") ? this.baseUrl : this.baseUrl + "/");
    // Issuing is harmless to repeat (an unused token just expires), so every
    // kind of retry is allowed here.
    const response = await this._send(
      () =>
        this._fetch(url.href, {
          method: "POST",
          headers: { "Content-Type": "application/json" },
          body: JSON.stringify(body),
          credentials: this.credentials,
          cache: "no-store",
          signal: options.signal,
        }),
      options.signal,
      { stage: "token" },
    );
    if (response.status === 201) return response.json();
    const problem = await readProblem(response);
    throw this._errorFor(response, problem, "The token service refused to issue a token", "token");
  }

  /** Start a new action: one token, shared by every request of the action. */
  action(scope, options = {}) {
    return new TokenAction(this, scope, options);
  }

  /** One request as one action: a fresh token, kept across this call's own retries. */
  fetch(input, init = {}, options = {}) {
    const { scope, ...actionOptions } = options;
    if (!scope) throw new TypeError("TokenClient.fetch needs options.scope");
    return this.action(scope, actionOptions).fetch(input, init);
  }

  // Runs send() until it yields a response that is not worth retrying.
  // Failures (network, 503) spend `retries`; waiting for another request of
  // the same action (409 token_in_progress) spends `inProgressWaitMs`.
  async _send(send, signal, { stage, retryInProgress = false, onRetry = null } = {}) {
    let failures = 0;
    let polls = 0;
    let waitedMs = 0;
    for (let attempt = 1; ; attempt++) {
      let response;
      let reason;
      let delayMs;
      try {
        response = await send();
      } catch (error) {
        if (isAbort(error) || signal?.aborted) throw error;
        if (failures >= this.retries) {
          const what = stage === "token" ? "No token: the token service" : "The request";
          throw new NetworkError(`${what} could not be reached (${attempt} attempts): ${error.message}`, {
            stage,
            cause: error,
          });
        }
        reason = "network";
      }
      if (response?.status === 503 && failures < this.retries) {
        reason = "unavailable";
        const after = retryAfterSeconds(response, await readProblem(response));
        if (after !== null) delayMs = after * 1000;
      } else if (response?.status === 409 && retryInProgress) {
        const problem = await readProblem(response);
        if (problem?.code !== "token_in_progress" || waitedMs >= this.inProgressWaitMs) return response;
        // Another request of this action holds the token: poll for its stored
        // result. Retry-After is when the holder's lease would run out (if it
        // crashed); the usual finish is much sooner.
        reason = "in_progress";
        const after = retryAfterSeconds(response, problem);
        delayMs = Math.min(this._backoff(polls++), after === null ? Infinity : after * 1000, 1000);
      } else if (response) {
        return response;
      }
      if (reason === "in_progress") {
        waitedMs += delayMs;
      } else {
        delayMs ??= this._backoff(failures);
        failures += 1;
      }
      delayMs = Math.min(this.maxRetryDelayMs, delayMs);
      const retry = { attempt, reason, delayMs, stage };
      this.onRetry?.(retry);
      onRetry?.(retry);
      await sleep(delayMs, signal);
    }
  }

  _backoff(n) {
    return this.retryDelayMs * 2 ** n * (0.75 + Math.random() / 2);
  }

  _errorFor(response, problem, what, stage) {
    const code = problem?.code ?? "";
    const detail = problem?.detail ?? problem?.title ?? response.statusText;
    const details = { status: response.status, code, problem, response, stage };
    const message = `${what}: ${response.status}${code ? " " + code : ""}${detail ? " — " + detail : ""}`;
    if (response.status === 429) {
      return new RateLimitedError(message, { ...details, retryAfterSeconds: retryAfterSeconds(response, problem) });
    }
    if (response.status === 409) {
      return new DuplicateRequestError(message, {
        ...details,
        retryAfterSeconds: retryAfterSeconds(response, problem),
      });
    }
    return new TokenClientError(message, details);
  }
}

/**
 * One user intent. Its token is fetched on first use (or given as
 * options.token) and reused by every request of the action. options: subject,
 * fingerprint, ttlSeconds (as getToken), token.
 */
export class TokenAction {
  constructor(client, scope, options = {}) {
    this.client = client;
    this.scope = scope;
    this.options = options;
    this.attempts = 0; // requests sent with this action's token(s), retries included
    this.renewals = 0; // fresh tokens that replaced one that expired unused
    // The current token: {token: Promise<string>, expiresAtMs, sent, spent}.
    // `spent`: some request carried it and got an answer other than "unknown
    // token" (or none at all) — it may have done its work, so it is never replaced.
    this._current = options.token
      ? { token: Promise.resolve(options.token), expiresAtMs: Infinity, sent: 0, spent: true, issued: false }
      : null;
  }

  /**
   * The action's token: fetched once and reused; fetched again when the last
   * fetch failed, or when it expired (or is about to) before any request carried it.
   */
  token() {
    return this._entry().token;
  }

  _entry() {
    const current = this._current;
    if (current && !(current.sent === 0 && current.issued && this.client.now() >= current.expiresAtMs)) {
      return current;
    }
    if (current) this.renewals += 1;
    return this._issue();
  }

  _issue() {
    const entry = { token: null, expiresAtMs: Infinity, sent: 0, spent: false, issued: false };
    entry.token = this.client.getToken(this.scope, this.options).then(
      (issued) => {
        // Counted from when the answer arrived, on this machine's clock: the
        // server's expires_at would drag in any clock difference.
        const lifetimeMs = Number(issued.ttl_seconds) * 1000;
        if (Number.isFinite(lifetimeMs)) {
          const margin = Math.min(this.client.expiryMarginMs, lifetimeMs / 4);
          entry.expiresAtMs = this.client.now() + lifetimeMs - margin;
        }
        entry.issued = true;
        return issued.token;
      },
      (error) => {
        if (this._current === entry) this._current = null;
        throw error;
      },
    );
    this._current = entry;
    return entry;
  }

  /**
   * fetch() with the action's token in the header. Resolves to the Response
   * (isReplayed(response) tells a stored answer to a duplicate); rejects with
   * DuplicateRequestError on 409, RateLimitedError on 429, NetworkError when
   * every attempt failed (error.stage: "token" when no token could be had, so
   * nothing was sent). The body must be re-readable (a string, Blob, FormData
   * or URLSearchParams), since retries send it again.
   * options.onRetry({attempt, reason, delayMs, stage}) hears this call's retries;
   * reason is "network", "unavailable" (503) or "in_progress" (409).
   */
  async fetch(input, init = {}, options = {}) {
    const template = new Request(input, init);
    let response = await this._fetchWith(this._entry(), template, init.signal, options);
    if (response.renew) {
      // The token expired before it was ever used (the backend does not know it):
      // nothing was done with it, so a fresh one is safe. Once per call.
      response = await this._fetchWith(this._renew(response.entry), template, init.signal, options);
    }
    response = response.response;
    if (response.status === 409 || response.status === 429) {
      throw this.client._errorFor(
        response,
        await readProblem(response),
        "The request was refused",
        "request",
      );
    }
    return response;
  }

  _renew(stale) {
    if (this._current !== stale) return this._entry(); // another call renewed it already
    this.renewals += 1;
    return this._issue();
  }

  async _fetchWith(entry, template, signal, options) {
    const token = await entry.token;
    entry.sent += 1;
    let response;
    try {
      response = await this.client._send(
        () => {
          const request = template.clone();
          request.headers.set(this.client.header, token);
          this.attempts += 1;
          return this.client._fetch(request);
        },
        signal,
        { stage: "request", retryInProgress: true, onRetry: options.onRetry },
      );
    } catch (error) {
      entry.spent = true; // no answer: the request may have run
      throw error;
    }
    if (response.status === 404 && entry.issued && !entry.spent) {
      const problem = await readProblem(response);
      if (problem?.code === "token_invalid") return { response, renew: true, entry };
    }
    entry.spent = true;
    return { response, renew: false, entry };
  }
}
const defaultClients = new Map();
function defaultClient(options) {
  const baseUrl = options?.baseUrl ?? defaultBaseUrl();
  if (!defaultClients.has(baseUrl)) defaultClients.set(baseUrl, new TokenClient({ baseUrl }));
  return defaultClients.get(baseUrl);
}

/** getToken(scope, {subject, fingerprint, ttlSeconds, baseUrl, signal}) with a default client. */
export function getToken(scope, options = {}) {
  return defaultClient(options).getToken(scope, options);
}

/** fetch(input, init) as one action: options {scope, subject, fingerprint, ttlSeconds, baseUrl}. */
export function idempotentFetch(input, init = {}, options = {}) {
  return defaultClient(options).fetch(input, init, options);
}

Object.assign(TokenClient, {
  TokenAction,
  TokenClientError,
  DuplicateRequestError,
  RateLimitedError,
  NetworkError,
  isReplayed,
  getToken,
  idempotentFetch,
});

// For pages that load the module with a tag instead of importing it.
if (typeof window !== "undefined" && !("TokenClient" in window)) {
  window.TokenClient = TokenClient;
  window.dispatchEvent(new Event("tokenclient:ready"));
}

export default TokenClient;
