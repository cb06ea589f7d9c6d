// Types of token-client.js, the browser helper of token-service.

/** Where a failure happened: "token" (no token could be had, nothing was sent) or "request". */
export type Stage = "token" | "request" | "";

/** Why a request is sent again: a network error, a 503, or another request of the action still running. */
export type RetryReason = "network" | "unavailable" | "in_progress";

export interface RetryInfo {
  /** 1 for the first retry of this call. */
  attempt: number;
  reason: RetryReason;
  delayMs: number;
  /** "token": asking for a token (none exists yet); "request": resending with the action's token. */
  stage: "token" | "request";
}

/** The body of a problem+json answer (RFC 9457) as the service writes it. */
export interface Problem {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  code?: string;
  retry_after_seconds?: number;
  errors?: Record<string, string[]>;
  error?: unknown;
  [field: string]: unknown;
}

/** What POST /token/generate answers. */
export interface IssuedToken {
  token: string;
  scope: string;
  subject: string | null;
  fingerprint: string | null;
  ttl_seconds: number;
  expires_at: string;
}

export interface TokenOptions {
  subject?: string | null;
  fingerprint?: string | null;
  ttlSeconds?: number | null;
  signal?: AbortSignal;
}

export interface ActionOptions {
  subject?: string | null;
  fingerprint?: string | null;
  ttlSeconds?: number | null;
  /** A token issued elsewhere (e.g. by your backend); it is never replaced. */
  token?: string;
}

export interface TokenClientOptions {
  /** The token service; default: where this module was loaded from (a bundled copy must pass it). */
  baseUrl?: string | URL;
  /** Default "Idempotency-Token". */
  header?: string;
  /** Retries of one request after a network error or a 503 (default 3). */
  retries?: number;
  /** First backoff delay, doubled each time, with jitter (default 250). */
  retryDelayMs?: number;
  /** Cap on any wait, Retry-After included (default 5000). */
  maxRetryDelayMs?: number;
  /** How long a request polls while another request of its action holds the token (default 10000). */
  inProgressWaitMs?: number;
  /** An unsent token this close to its expiry is replaced (default 5000, at most a quarter of its lifetime). */
  expiryMarginMs?: number;
  /** fetch credentials for the token service (default "omit"). */
  credentials?: RequestCredentials;
  fetch?: typeof globalThis.fetch;
  /** The clock in milliseconds, for durations only (default performance.now: monotonic). */
  now?: () => number;
  onRetry?: ((retry: RetryInfo) => void) | null;
}

export interface ErrorDetails {
  status?: number;
  code?: string;
  problem?: Problem | null;
  response?: Response | null;
  stage?: Stage;
  retryAfterSeconds?: number | null;
  cause?: unknown;
}

/** Base class of every error this module throws. */
export class TokenClientError extends Error {
  constructor(message: string, details?: ErrorDetails);
  /** HTTP status, 0 when no response came back. */
  status: number;
  /** The service's stable problem code, e.g. "token_used". */
  code: string;
  problem: Problem | null;
  response: Response | null;
  stage: Stage;
}

/** 409: "token_used", "token_failed" (stored error in problem.error) or "token_in_progress". */
export class DuplicateRequestError extends TokenClientError {
  retryAfterSeconds: number | null;
}

/** 429: too many tokens or requests; try again after retryAfterSeconds. */
export class RateLimitedError extends TokenClientError {
  retryAfterSeconds: number | null;
}

/** The network failed on every attempt (the last error is `cause`). */
export class NetworkError extends TokenClientError {}

/** True when the backend answered with the stored response of an earlier request. */
export function isReplayed(response: Response | null | undefined): boolean;

export interface ActionFetchOptions {
  onRetry?: (retry: RetryInfo) => void;
}

/** One user intent: one token, shared by every request of the action. */
export class TokenAction {
  constructor(client: TokenClient, scope: string, options?: ActionOptions);
  readonly client: TokenClient;
  readonly scope: string;
  readonly options: ActionOptions;
  /** Requests sent with this action's token(s), retries included. */
  attempts: number;
  /** Fresh tokens that replaced one that expired unused. */
  renewals: number;
  /** The action's token (fetched once; again after a failed fetch or when it expired unused). */
  token(): Promise<string>;
  /** fetch() with the action's token in the header. */
  fetch(input: RequestInfo | URL, init?: RequestInit, options?: ActionFetchOptions): Promise<Response>;
}

export interface ClientFetchOptions extends ActionOptions {
  scope: string;
}

/** A client of one token service. */
export class TokenClient {
  constructor(options?: TokenClientOptions);
  baseUrl: string;
  header: string;
  retries: number;
  retryDelayMs: number;
  maxRetryDelayMs: number;
  inProgressWaitMs: number;
  expiryMarginMs: number;
  credentials: RequestCredentials;
  now: () => number;
  onRetry: ((retry: RetryInfo) => void) | null;
  /** POST /token/generate. */
  getToken(scope: string, options?: TokenOptions): Promise<IssuedToken>;
  /** Start a new action: one token, shared by every request of the action. */
  action(scope: string, options?: ActionOptions): TokenAction;
  /** One request as one action. */
  fetch(input: RequestInfo | URL, init: RequestInit | undefined, options: ClientFetchOptions): Promise<Response>;

  static TokenAction: typeof TokenAction;
  static TokenClientError: typeof TokenClientError;
  static DuplicateRequestError: typeof DuplicateRequestError;
  static RateLimitedError: typeof RateLimitedError;
  static NetworkError: typeof NetworkError;
  static isReplayed: typeof isReplayed;
  static getToken: typeof getToken;
  static idempotentFetch: typeof idempotentFetch;
}

export interface DefaultClientOptions {
  baseUrl?: string;
}

/** getToken with a default client per baseUrl. */
export function getToken(scope: string, options?: TokenOptions & DefaultClientOptions): Promise<IssuedToken>;

/** fetch(input, init) as one action of a default client. */
export function idempotentFetch(
  input: RequestInfo | URL,
  init: RequestInit | undefined,
  options: ClientFetchOptions & DefaultClientOptions,
): Promise<Response>;

export default TokenClient;

declare global {
  interface Window {
    /** Set when the module is loaded with a <script type="module"> tag. */
    TokenClient?: typeof TokenClient;
  }
}
