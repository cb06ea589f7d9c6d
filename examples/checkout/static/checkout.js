// The checkout page: one order = one action = one token. Every click on "Pay"
// of that order sends the same token, so the shop charges once.

const ITEM = { amount_cents: 1250, currency: "EUR", item: "coffee-beans-250g" };

export function startCheckout(TokenClient, { scope }) {
  const { isReplayed, DuplicateRequestError, RateLimitedError } = TokenClient;
  const $ = (id) => document.getElementById(id);
  const pay = $("pay");
  const newOrder = $("new-order");
  const status = $("status");
  const results = $("results");
  const log = $("log");

  const note = (text) => {
    const li = document.createElement("li");
    li.textContent = `${new Date().toISOString().slice(11, 23)} ${text}`;
    log.append(li);
  };
  const setStatus = (state, text) => {
    status.dataset.state = state;
    status.textContent = text;
  };

  // Every request the helper makes shows up in the network log (never the token itself).
  const loggedFetch = async (input, init) => {
    const request = new Request(input, init);
    const path = new URL(request.url).pathname;
    try {
      const response = await fetch(request);
      note(`${request.method} ${path} → ${response.status}${isReplayed(response) ? " (replayed)" : ""}`);
      return response;
    } catch (error) {
      note(`${request.method} ${path} → network error`);
      throw error;
    }
  };
  const client = new TokenClient({
    fetch: loggedFetch,
    onRetry: ({ attempt, reason, delayMs }) =>
      note(`retry ${attempt} after ${reason} in ${Math.round(delayMs)} ms, with the same token`),
  });

  let orderNumber = 1;
  let action = client.action(scope);
  let clicks = 0;
  let paidCharge = null;

  const show = (outcome, text) => {
    const li = document.createElement("li");
    li.dataset.outcome = outcome;
    li.textContent = text;
    results.append(li);
  };

  pay.addEventListener("click", async () => {
    const click = ++clicks;
    const thisAction = action;
    const thisOrder = orderNumber;
    note(`click ${click} on Pay (order #${thisOrder})`);
    if (!paidCharge) setStatus("paying", "Paying…");
    let lostReply = false;
    try {
      const response = await thisAction.fetch(
        "/api/charges",
        { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(ITEM) },
        { onRetry: ({ reason }) => (lostReply ||= reason === "network") },
      );
      if (thisAction !== action) return; // the user moved on to a new order
      const body = await response.json();
      if (!response.ok) {
        show("error", `Click ${click}: the shop refused: ${body.detail ?? response.status}`);
        setStatus("error", "Payment failed.");
        return;
      }
      const charge = body.charge;
      paidCharge = charge;
      if (!isReplayed(response)) {
        show("charged", `Click ${click}: paid — charge ${charge.id}.`);
      } else if (lostReply) {
        show(
          "recovered",
          `Click ${click}: paid — charge ${charge.id}. The reply was lost on the way; ` +
            "the retry carried the same token and got the stored result.",
        );
      } else {
        show(
          "duplicate",
          `Click ${click}: duplicate — charge ${charge.id} was already paid; ` +
            "the stored result was replayed, nothing was charged again.",
        );
      }
      setStatus("paid", `Paid: charge ${charge.id}, €${(charge.amount_cents / 100).toFixed(2)}.`);
    } catch (error) {
      if (thisAction !== action) return;
      if (error instanceof DuplicateRequestError) {
        show("refused", `Click ${click}: refused as a duplicate (${error.code}).`);
      } else if (error instanceof RateLimitedError) {
        const wait = error.retryAfterSeconds ?? "a few";
        show("rate-limited", `Click ${click}: too many requests; try again in ${wait} s.`);
      } else {
        show("error", `Click ${click}: ${error.message}`);
      }
      if (!paidCharge) setStatus("error", "Payment not confirmed.");
    }
  });

  newOrder.addEventListener("click", () => {
    orderNumber += 1;
    action = client.action(scope); // a new action gets a fresh token
    clicks = 0;
    paidCharge = null;
    results.replaceChildren();
    $("order").textContent = `#${orderNumber}`;
    note(`new order #${orderNumber}`);
    setStatus("ready", "Ready to pay.");
  });

  pay.disabled = false;
  newOrder.disabled = false;
  setStatus("ready", "Ready to pay.");
}
