// Unit tests of token-client.js with Node's built-in test runner: `node --test` in frontend/.
// The token service and the backend are a scripted fetch; time is a fake clock.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";

import TokenClientDefault, {
  DuplicateRequestError,
  NetworkError,
  RateLimitedError,
  TokenAction,
  TokenClient,
  TokenClientError,
  getToken,
  idempotentFetch,
  isReplayed,
} from "token-service-client"; // the package itself, through its package.json "exports"

const SERVICE = "https://tokens.example/";
const BACKEND = "https://shop.example/api/charges";
const POST = { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" };

const json = (status, body, headers = {}) =>
  new Response(JSON.stringify(body), {
    status,
    headers: { "Content-Type": status >= 400 ? "application/problem+json" : "application/json", ...headers },
  });

/**
 * A scripted network. `service` answers POST /token/generate (default: a fresh
 * token each time, 300 s); `backend` is a list of answers for the backend, used
 * in order (the last repeats); an answer is a Response factory or an Error to throw.
 */
function network({ service, backend = [() => json(201, { ok: true })] } = {}) {
  const calls = { tokens: [], backend: [] };
  let issued = 0;
  const fetch = async (input, init) => {
    const request = new Request(input, init);
    if (request.url === SERVICE + "token/generate") {
      const body = await request.json();
      calls.tokens.push(body);
      const answer = service ? service(calls.tokens.length, body) : null;
      if (answer instanceof Error) throw answer;
      if (answer) return answer;
      issued += 1;
      return json(201, { token: `tok-${issued}`, scope: body.scope, ttl_seconds: body.ttl_seconds ?? 300 });
    }
    calls.backend.push({ token: request.headers.get("Idempotency-Token"), body: await request.text() });
    const answer = backend[Math.min(calls.backend.length, backend.length) - 1];
    if (answer instanceof Error) throw answer;
    return answer();
  };
  return { fetch, calls };
}

function clock(start = 1_000_000) {
  const c = { ms: start, now: () => c.ms };
  return c;
}

const client = (net, options = {}) =>
  new TokenClient({ baseUrl: SERVICE, fetch: net.fetch, retryDelayMs: 1, ...options });

describe("getToken", () => {
  it("posts the scope and the bindings to <baseUrl>/token/generate", async () => {
    const net = network();
    const issued = await client(net).getToken("payment.create", {
      subject: "shopper-1",
      fingerprint: "order-7",
      ttlSeconds: 60,
    });
    assert.equal(issued.token, "tok-1");
    assert.deepEqual(net.calls.tokens, [
      { scope: "payment.create", subject: "shopper-1", fingerprint: "order-7", ttl_seconds: 60 },
    ]);
  });

  it("fails with stage 'token' and says so in its retries when the service is unreachable", async () => {
    const net = network({ service: () => new TypeError("Failed to fetch") });
    const retries = [];
    const tokens = client(net, { retries: 2, onRetry: (retry) => retries.push(retry) });
    const action = tokens.action("payment.create");
    await assert.rejects(action.fetch(BACKEND, POST), (error) => {
      assert.ok(error instanceof NetworkError);
      assert.equal(error.stage, "token");
      assert.equal(error.cause.message, "Failed to fetch");
      return true;
    });
    assert.deepEqual(
      retries.map(({ stage, reason }) => [stage, reason]),
      [["token", "network"], ["token", "network"]],
    );
    assert.equal(net.calls.tokens.length, 3);
    assert.equal(net.calls.backend.length, 0, "nothing may reach the backend without a token");
    assert.equal(action.attempts, 0);
  });

  it("turns a 429 into RateLimitedError with the wait from the body", async () => {
    const net = network({ service: () => json(429, { code: "rate_limited", retry_after_seconds: 12 }) });
    await assert.rejects(client(net).getToken("s"), (error) => {
      assert.ok(error instanceof RateLimitedError);
      assert.equal(error.retryAfterSeconds, 12);
      assert.equal(error.stage, "token");
      return true;
    });
  });

  it("retries a 503 and honours Retry-After, capped by maxRetryDelayMs", async () => {
    let answered = 0;
    const net = network({
      service: () => (answered++ === 0 ? json(503, { code: "store_unavailable" }, { "Retry-After": "60" }) : null),
    });
    const retries = [];
    const issued = await client(net, { maxRetryDelayMs: 5, onRetry: (r) => retries.push(r) }).getToken("s");
    assert.equal(issued.token, "tok-1");
    assert.deepEqual(retries, [{ attempt: 1, reason: "unavailable", delayMs: 5, stage: "token" }]);
  });
});

describe("an action", () => {
  it("sends one token with every request, retries included; a new action gets a fresh one", async () => {
    const net = network({
      backend: [new TypeError("connection reset"), () => json(503, { code: "store_unavailable" }), () => json(201, {})],
    });
    const retries = [];
    const tokens = client(net);
    const action = tokens.action("payment.create");
    const response = await action.fetch(BACKEND, POST, { onRetry: (r) => retries.push(r) });
    assert.equal(response.status, 201);
    assert.deepEqual(
      retries.map(({ stage, reason }) => [stage, reason]),
      [["request", "network"], ["request", "unavailable"]],
    );
    assert.equal(action.attempts, 3);
    await tokens.action("payment.create").fetch(BACKEND, POST);
    assert.deepEqual(
      net.calls.backend.map((call) => call.token),
      ["tok-1", "tok-1", "tok-1", "tok-2"],
    );
  });

  it("shares one token between concurrent requests (a double submit)", async () => {
    const net = network();
    const action = client(net).action("s");
    await Promise.all([action.fetch(BACKEND, POST), action.fetch(BACKEND, POST)]);
    assert.equal(net.calls.tokens.length, 1);
    assert.deepEqual(
      net.calls.backend.map((call) => call.token),
      ["tok-1", "tok-1"],
    );
  });

  it("gives the request's network failure stage 'request'", async () => {
    const net = network({ backend: [new TypeError("Failed to fetch")] });
    await assert.rejects(client(net, { retries: 1 }).action("s").fetch(BACKEND, POST), (error) => {
      assert.ok(error instanceof NetworkError);
      assert.equal(error.stage, "request");
      return true;
    });
    assert.equal(net.calls.backend.length, 2);
  });

  it("rejects a 409 with DuplicateRequestError and its problem", async () => {
    const failed = { code: "token_failed", detail: "declined", error: { reason: "card" } };
    const net = network({ backend: [() => json(409, failed)] });
    await assert.rejects(client(net).action("s").fetch(BACKEND, POST), (error) => {
      assert.ok(error instanceof DuplicateRequestError);
      assert.ok(error instanceof TokenClientError);
      assert.equal(error.code, "token_failed");
      assert.equal(error.stage, "request");
      assert.deepEqual(error.problem.error, { reason: "card" });
      return true;
    });
  });

  it("polls a 409 token_in_progress for the stored result, with the same token", async () => {
    const net = network({
      backend: [
        () => json(409, { code: "token_in_progress", retry_after_seconds: 30 }, { "Retry-After": "30" }),
        () => json(201, { id: 1 }, { "Idempotent-Replayed": "true" }),
      ],
    });
    const retries = [];
    const response = await client(net).action("s").fetch(BACKEND, POST, { onRetry: (r) => retries.push(r) });
    assert.ok(isReplayed(response));
    assert.equal(retries.length, 1);
    assert.equal(retries[0].reason, "in_progress");
    assert.ok(retries[0].delayMs < 1000);
  });

  it("gives up polling after inProgressWaitMs", async () => {
    const net = network({ backend: [() => json(409, { code: "token_in_progress", retry_after_seconds: 30 })] });
    const action = client(net, { retryDelayMs: 5, inProgressWaitMs: 40 }).action("s");
    await assert.rejects(action.fetch(BACKEND, POST), (error) => {
      assert.ok(error instanceof DuplicateRequestError);
      assert.equal(error.code, "token_in_progress");
      assert.equal(error.retryAfterSeconds, 30);
      return true;
    });
    assert.ok(net.calls.backend.length >= 2 && net.calls.backend.length <= 10, net.calls.backend.length);
  });

  it("rejects a 429 from the backend with RateLimitedError", async () => {
    const net = network({ backend: [() => json(429, { code: "rate_limited", retry_after_seconds: 7 })] });
    await assert.rejects(client(net).action("s").fetch(BACKEND, POST), (error) => {
      assert.ok(error instanceof RateLimitedError);
      assert.equal(error.retryAfterSeconds, 7);
      return true;
    });
  });
});

describe("a token that expired while the page sat open", () => {
  it("is replaced before it is sent, once it is within the margin of its expiry", async () => {
    const time = clock();
    const net = network();
    const action = client(net, { now: time.now, expiryMarginMs: 5000 }).action("s", { ttlSeconds: 60 });
    assert.equal(await action.token(), "tok-1");
    time.ms += 54_000;
    assert.equal(await action.token(), "tok-1", "still 6 s to go");
    time.ms += 2_000;
    assert.equal(await action.token(), "tok-2", "within the 5 s margin");
    await action.fetch(BACKEND, POST);
    assert.deepEqual(
      net.calls.backend.map((call) => call.token),
      ["tok-2"],
    );
    assert.equal(action.renewals, 1);
  });

  it("keeps the margin within a quarter of a short token's lifetime", async () => {
    const time = clock();
    const action = client(network(), { now: time.now }).action("s", { ttlSeconds: 4 });
    await action.token();
    time.ms += 2_900;
    assert.equal(await action.token(), "tok-1");
    time.ms += 200;
    assert.equal(await action.token(), "tok-2");
  });

  it("is never replaced once a request carried it", async () => {
    const time = clock();
    const net = network();
    const action = client(net, { now: time.now }).action("s", { ttlSeconds: 60 });
    await action.fetch(BACKEND, POST);
    time.ms += 3_600_000;
    await action.fetch(BACKEND, POST);
    assert.deepEqual(
      net.calls.backend.map((call) => call.token),
      ["tok-1", "tok-1"],
    );
    assert.equal(net.calls.tokens.length, 1);
  });

  it("is replaced once when the backend does not know it (404 token_invalid on its first use)", async () => {
    const net = network({ backend: [() => json(404, { code: "token_invalid" }), () => json(201, {})] });
    const action = client(net).action("s");
    const response = await action.fetch(BACKEND, POST);
    assert.equal(response.status, 201);
    assert.deepEqual(
      net.calls.backend.map((call) => call.token),
      ["tok-1", "tok-2"],
    );
    assert.equal(action.renewals, 1);
  });

  it("is not replaced twice in one call", async () => {
    const net = network({ backend: [() => json(404, { code: "token_invalid" })] });
    const response = await client(net).action("s").fetch(BACKEND, POST);
    assert.equal(response.status, 404);
    assert.equal(net.calls.backend.length, 2);
  });

  it("is not replaced after an answer that may have done the work", async () => {
    // The first request's reply was lost (the work may be done): a later 404 must not buy a new token.
    const net = network({
      backend: [new TypeError("reset"), new TypeError("reset"), () => json(404, { code: "token_invalid" })],
    });
    const action = client(net, { retries: 1 }).action("s");
    await assert.rejects(action.fetch(BACKEND, POST), NetworkError);
    const response = await action.fetch(BACKEND, POST);
    assert.equal(response.status, 404);
    assert.deepEqual(new Set(net.calls.backend.map((call) => call.token)), new Set(["tok-1"]));
  });

  it("is never replaced when the page gave the token itself", async () => {
    const time = clock();
    const net = network({ backend: [() => json(404, { code: "token_invalid" })] });
    const action = client(net, { now: time.now }).action("s", { token: "given" });
    time.ms += 3_600_000;
    assert.equal(await action.token(), "given");
    const response = await action.fetch(BACKEND, POST);
    assert.equal(response.status, 404);
    assert.equal(net.calls.tokens.length, 0);
  });

  it("is fetched again after a failed fetch", async () => {
    let calls = 0;
    const net = network({ service: () => (calls++ === 0 ? json(500, { code: "internal_error" }) : null) });
    const action = client(net).action("s");
    await assert.rejects(action.token(), (error) => error instanceof TokenClientError && error.status === 500);
    assert.equal(await action.token(), "tok-1");
  });
});

describe("the module", () => {
  it("exports the documented names, also as static members of the default export", () => {
    assert.equal(TokenClientDefault, TokenClient);
    for (const [name, value] of Object.entries({
      TokenAction,
      TokenClientError,
      DuplicateRequestError,
      RateLimitedError,
      NetworkError,
      isReplayed,
      getToken,
      idempotentFetch,
    })) {
      assert.equal(TokenClient[name], value, name);
    }
  });

  it("declares in its .d.ts every name it exports", async () => {
    const module = await import("token-service-client");
    const types = readFileSync(new URL("../token-client.d.ts", import.meta.url), "utf8");
    const declared = new Set(
      [...types.matchAll(/^export (?:declare )?(?:class|function|const) (\w+)/gm)].map((match) => match[1]),
    );
    const exported = Object.keys(module).filter((name) => name !== "default");
    assert.deepEqual([...declared].sort(), exported.sort());
    assert.match(types, /^export default TokenClient;$/m);
  });

  it("tells a replayed response by its header", () => {
    assert.equal(isReplayed(new Response("", { headers: { "Idempotent-Replayed": "true" } })), true);
    assert.equal(isReplayed(new Response("")), false);
    assert.equal(isReplayed(null), false);
  });
});

describe("this machine's wall clock", () => {
  // Date.now() set far off (a laptop back from sleep, a clock set by hand): nothing
  // the helper decides may move with it.
  function shiftedWallClock(offsetMs) {
    const realNow = Date.now;
    Date.now = () => realNow() + offsetMs;
    return () => {
      Date.now = realNow;
    };
  }

  for (const offsetMs of [-3_600_000, 3_600_000]) {
    it(`does not age an unsent token (Date.now ${offsetMs > 0 ? "+" : "-"}1 h)`, async () => {
      const net = network();
      const action = client(net).action("s", { ttlSeconds: 60 });
      assert.equal(await action.token(), "tok-1");
      const restore = shiftedWallClock(offsetMs);
      try {
        assert.equal(await action.token(), "tok-1");
      } finally {
        restore();
      }
      assert.equal(action.renewals, 0);
    });

    it(`waits what the service said, not an HTTP-date against this clock (Date.now ${offsetMs > 0 ? "+" : "-"}1 h)`, async () => {
      let answered = 0;
      const date = new Date(Date.now() + 60_000).toUTCString(); // a proxy's Retry-After, on its clock
      const net = network({
        service: () =>
          answered++ === 0 ? json(503, { code: "store_unavailable", retry_after_seconds: 0.05 }, { "Retry-After": date }) : null,
      });
      const retries = [];
      const restore = shiftedWallClock(offsetMs);
      try {
        const options = { maxRetryDelayMs: 10_000, onRetry: (r) => retries.push(r) };
        assert.equal((await client(net, options).getToken("s")).token, "tok-1");
      } finally {
        restore();
      }
      assert.equal(retries[0].delayMs, 50);
    });
  }
});
