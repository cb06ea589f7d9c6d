// A backend written against the types openapi-typescript generates from openapi.yaml, with
// openapi-fetch (requests and replies typed by path). tests/contract/test_generated_clients.py
// generates ./token-service.d.ts with the command of docs/http-api.md, compiles this file with
// `tsc --strict` and runs it against the service; it prints what it saw as one JSON document,
// which the test holds to the contract. The lines marked @ts-expect-error must not compile: the
// types are real, not `any` or `never` (tsc reports an unused @ts-expect-error).
import createClient from "openapi-fetch";
import type { components, paths } from "./token-service.js";

type Problem = components["schemas"]["Problem"];
type AdminRecord = components["schemas"]["AdminRecord"];

const baseUrl = process.env.TOKEN_SERVICE_URL ?? "";
const frontend = createClient<paths>({ baseUrl });
const backend = createClient<paths>({
  baseUrl,
  headers: { Authorization: `Bearer ${process.env.TOKEN_SERVICE_API_KEY ?? ""}` },
});
const admin = createClient<paths>({
  baseUrl,
  headers: { Authorization: `Bearer ${process.env.TOKEN_SERVICE_ADMIN_KEY ?? ""}` },
});
const scope = "payment.create";

async function issue(body: components["schemas"]["GenerateRequest"]): Promise<string> {
  const { data, error } = await frontend.POST("/token/generate", { body });
  if (data === undefined) throw new Error(`generate: ${JSON.stringify(error)}`);
  return data.token;
}

async function walkThrough() {
  const token = await issue({ scope, subject: "shopper-1" });
  const won = await backend.POST("/token/consume", {
    body: { token, scope, subject: "shopper-1", request_id: "order-1" },
  });
  if (won.data === undefined) throw new Error(`consume: ${JSON.stringify(won.error)}`);
  const duplicate = await backend.POST("/token/consume", { body: { token, scope, subject: "shopper-1" } });
  if (duplicate.error === undefined) throw new Error("the duplicate was not refused");
  const problem: Problem = duplicate.error;
  const code: Problem["code"] = problem.code;
  // @ts-expect-error a code is one of the documented ones, not any string
  const unknown: Problem["code"] = "no_such_code";
  void unknown;
  return {
    consumed: { outcome: won.data.outcome, replayed: won.data.replayed },
    duplicate: {
      http_status: duplicate.response.status,
      status: problem.status,
      code,
      is_token_used: code === "token_used",
      token_ref: problem.token_ref ?? null,
      request_id: duplicate.response.headers.get("X-Request-ID"),
    },
  };
}

async function fieldErrors() {
  const refused = await frontend.POST("/token/generate", { body: { scope: "no spaces allowed" } });
  if (refused.error === undefined) throw new Error("a bad scope was accepted");
  const errors = refused.error.errors ?? {}; // as generated: field → list of messages
  const messages = errors["scope"] ?? [];
  const first: string | undefined = messages[0];
  // @ts-expect-error a field's messages are strings
  const wrong: number | undefined = messages[0];
  void wrong;
  return { http_status: refused.response.status, code: refused.error.code, errors, first };
}

async function twoPhase() {
  const token = await issue({ scope, fingerprint: "order-7" });
  const begin = { token, scope, fingerprint: "order-7", request_id: "pay-7" };
  const started = await backend.POST("/token/begin", { body: begin });
  if (started.data === undefined || started.data.outcome !== "started") {
    throw new Error(`begin: ${JSON.stringify(started.error ?? started.data)}`);
  }
  const leaseId: string = started.data.lease_id;
  const result = { charge: "ch_7", amount_cents: 1250 };
  const completed = await backend.POST("/token/complete", { body: { token, lease_id: leaseId, result } });
  if (completed.data === undefined) throw new Error(`complete: ${JSON.stringify(completed.error)}`);
  const again = await backend.POST("/token/begin", { body: { ...begin, request_id: "pay-7-again" } });
  if (again.data === undefined || again.data.outcome !== "succeeded") {
    throw new Error(`replay: ${JSON.stringify(again.error ?? again.data)}`);
  }
  return {
    started: { outcome: started.data.outcome, lease_seconds: started.data.lease_seconds },
    completed: { outcome: completed.data.outcome, replayed: completed.data.replayed },
    replay: { outcome: again.data.outcome, replayed: again.data.replayed, result: again.data.result },
  };
}

// An Idempotency-Key record's stored response, as generated: the stored reply, or one that
// could not be read.
function storedStatus(response: NonNullable<AdminRecord["response"]>): number | null {
  if (!("status" in response)) {
    const bytes: number = response.bytes; // an UnreadableResponse: its size only
    void bytes;
    return null;
  }
  const status = response.status;
  // @ts-expect-error a stored status is a number
  const wrong: string = status;
  void wrong;
  return status;
}

async function adminRecord(ref: string) {
  const shown = await admin.GET("/admin/records/{ref}", { params: { path: { ref } } });
  if (shown.data === undefined) throw new Error(`admin: ${JSON.stringify(shown.error)}`);
  const record: AdminRecord = shown.data;
  const status = record.response === undefined ? undefined : storedStatus(record.response);
  return {
    kind: record.kind,
    ref: record.ref,
    state: record.state,
    is_consumed: record.state === "CONSUMED",
    scope: record.scope ?? null,
    request_id: record.request_id ?? null,
    stored_status: status ?? null,
  };
}

async function main(): Promise<void> {
  const walk = await walkThrough();
  const seen = {
    walk_through: walk,
    field_errors: await fieldErrors(),
    two_phase: await twoPhase(),
    admin: await adminRecord(walk.duplicate.token_ref ?? ""),
  };
  process.stdout.write(JSON.stringify(seen));
}

await main();
