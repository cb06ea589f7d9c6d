// The checkout page. One order = one action = one token, bound to the order
// (fingerprint) and the shopper (subject); the shop charges an order at most
// once whatever the page does (reload, Back, a second tab, a new token). So
// when the order's token is gone (expired after a request carried it, or failed
// with a payment that did not go through), the page takes a fresh one for it.
// Everything the shopper reads is in #status and #results; #log is for the curious.

export function startCheckout(TokenClient, config) {
  const { isReplayed, RateLimitedError, DuplicateRequestError } = TokenClient;
  const order = config.order;
  const $ = (id) => document.getElementById(id);
  const pay = $("pay");
  const retry = $("retry");
  const newOrder = $("new-order");
  const status = $("status");
  const results = $("results");
  const log = $("log");
  const price = `€${(order.amount_cents / 100).toFixed(2)}`;
  const chargeUrl = `/api/orders/${encodeURIComponent(order.id)}/charge`;
  const orderUrl = `/api/orders/${encodeURIComponent(order.id)}`;

  const note = (text) => {
    const li = document.createElement("li");
    li.textContent = `${new Date().toISOString().slice(11, 23)} ${text}`;
    log.append(li);
  };

  // Every request the helper makes shows up in the network log (never the token itself).
  const loggedFetch = async (input, init) => {
    const request = new Request(input, init);
    const url = new URL(request.url);
    const where = url.origin === location.origin ? "shop" : "token service";
    try {
      const response = await fetch(request);
      note(`${where}: ${request.method} ${url.pathname} → ${response.status}${isReplayed(response) ? " (replayed)" : ""}`);
      return response;
    } catch (error) {
      note(`${where}: ${request.method} ${url.pathname} → no answer`);
      throw error;
    }
  };
  const retryNote = ({ reason, delayMs, stage }) => {
    const ms = `${Math.round(delayMs)} ms`;
    if (stage === "token") {
      const why = reason === "network" ? "no answer" : "unavailable";
      note(`token service: ${why}; asking for a payment token again in ${ms}`);
    } else if (reason === "in_progress") {
      note(`shop: this payment is still being processed; asking for its result in ${ms}`);
    } else {
      const why = reason === "network" ? "no answer" : "unavailable";
      note(`shop: ${why}; sending the payment again with the same token in ${ms}`);
    }
  };
  const client = new TokenClient({ baseUrl: config.tokenService, fetch: loggedFetch, onRetry: retryNote });
  const newAction = () =>
    client.action(config.scope, {
      subject: order.shopper,
      fingerprint: order.id,
      ttlSeconds: config.tokenTtlSeconds ?? undefined,
    });
  let action = newAction();
  const problemCode = async (response) => {
    try {
      return (await response.clone().json())?.code ?? "";
    } catch {
      return "";
    }
  };

  let paid = order.status === "paid";
  let busy = false;
  let waitTimer = null;

  const setStatus = (state, text, { canPay = false, retryLabel = null } = {}) => {
    status.dataset.state = state;
    status.textContent = text;
    pay.disabled = !canPay;
    retry.hidden = retryLabel === null;
    if (retryLabel !== null) retry.textContent = retryLabel;
  };
  // A line per payment attempt, added when the attempt starts, so lines stay in order.
  const addLine = () => {
    const li = document.createElement("li");
    li.dataset.outcome = "pending";
    li.textContent = "Paying…";
    results.append(li);
    return (outcome, text) => {
      li.dataset.outcome = outcome;
      li.textContent = text;
    };
  };

  const showPaid = (charge) => {
    paid = true;
    clearInterval(waitTimer);
    setStatus("paid", `Paid — thank you! Charge ${charge.id}, ${price}. This order cannot be charged again.`);
    pay.textContent = "Paid";
  };
  const showUnavailable = () =>
    setStatus(
      "unavailable",
      "We can't reach the payment service right now. Your order is saved and you have not been charged. " +
        "Please try again in a moment.",
      { canPay: true, retryLabel: "Try again" },
    );
  const showRateLimited = (seconds) => {
    let left = Math.max(1, Math.ceil(seconds ?? 30));
    const show = () =>
      setStatus(
        "rate-limited",
        `Too many payment attempts from your connection. You have not been charged. ` +
          `Please wait ${left} s, then try again.`,
      );
    clearInterval(waitTimer);
    show();
    waitTimer = setInterval(() => {
      left -= 1;
      if (left > 0) return show();
      clearInterval(waitTimer);
      prepare();
    }, 1000);
  };

  // The shop's word on the order: after an answer that did not say, ask it.
  const orderStatus = async () => {
    try {
      const response = await loggedFetch(orderUrl, { cache: "no-store" });
      return response.ok ? await response.json() : null;
    } catch {
      return null;
    }
  };

  // Get the order's token ahead of the click: the click is quicker, and a token
  // service that is down is said now, not after the shopper pressed Pay.
  async function prepare() {
    if (paid) return;
    setStatus("preparing", "Getting ready to take your payment…");
    try {
      await action.token();
      if (!paid && !busy) setStatus("ready", "Ready to pay.", { canPay: true });
    } catch (error) {
      if (paid || busy) return;
      if (error instanceof RateLimitedError) showRateLimited(error.retryAfterSeconds);
      else showUnavailable();
    }
  }

  async function settle(finish, unclear) {
    // No clear answer (no reply, or the shop failed): the order in the shop's database decides.
    const current = await orderStatus();
    if (current?.status === "paid") {
      finish("charged", `Paid — charge ${current.charge.id}.`);
      showPaid(current.charge);
    } else if (current?.status === "unpaid" && !unclear) {
      // The token may be spent or failed by now: the next Pay takes a fresh one for this order.
      action = newAction();
      finish("not-charged", "The payment didn't go through. You were not charged.");
      setStatus("not-charged", "The payment didn't go through and you were not charged. Please try again.", {
        canPay: true,
      });
    } else {
      finish("unconfirmed", "We couldn't confirm this payment.");
      setStatus(
        "unconfirmed",
        "We couldn't confirm your payment yet. Paying again is safe: this order can only be charged once.",
        { canPay: true, retryLabel: "Check again" },
      );
    }
  }

  pay.addEventListener("click", async () => {
    if (busy || paid) return;
    busy = true;
    newOrder.disabled = true; // leaving the order mid-payment would hide its outcome
    const finish = addLine();
    setStatus("paying", "Paying… please keep this page open.");
    const first = action;
    const renewals = first.renewals;
    let lostReply = false;
    const send = () =>
      action.fetch(
        chargeUrl,
        { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" },
        { onRetry: ({ stage, reason }) => (lostReply ||= stage === "request" && reason === "network") },
      );
    try {
      let response = await send();
      if (first.renewals > renewals) note("page: the payment token had expired unused; got a fresh one");
      if (response.status === 404 && (await problemCode(response)) === "token_invalid") {
        // The token ran out after an earlier attempt carried it (the helper renews only unused
        // ones), so the shop refused this one before charging. The order is charged once whatever
        // the token: a fresh one is safe.
        note("page: the payment token had expired; got a fresh one for this order");
        action = newAction();
        response = await send();
      }
      if (response.ok) {
        const { charge } = await response.json();
        if (!isReplayed(response)) {
          finish("charged", `Paid — charge ${charge.id}.`);
        } else if (lostReply) {
          finish("recovered", `Paid — charge ${charge.id}. The first answer got lost on the way; asking again was safe.`);
        } else {
          finish("already-paid", `This order was already paid (charge ${charge.id}). You were not charged again.`);
        }
        showPaid(charge);
      } else {
        // 5xx: the shop failed closed (its guard, or a charge rolled back); 4xx: refused.
        note(`page: the shop answered ${response.status}`);
        await settle(finish, false);
      }
    } catch (error) {
      if (error instanceof RateLimitedError) {
        finish("rate-limited", "Too many payment attempts. You were not charged.");
        showRateLimited(error.retryAfterSeconds);
      } else if (error.stage === "token") {
        // No token, so the payment was never sent.
        finish("unavailable", "We couldn't reach the payment service. You were not charged.");
        showUnavailable();
      } else {
        // No reply from the shop, or a duplicate still running: it may have been charged.
        await settle(finish, !(error instanceof DuplicateRequestError && error.code === "token_failed"));
      }
    } finally {
      busy = false;
      newOrder.disabled = false;
    }
  });

  retry.addEventListener("click", async () => {
    if (status.dataset.state === "unconfirmed") {
      const current = await orderStatus();
      if (current?.status === "paid") return showPaid(current.charge);
      if (current) return setStatus("ready", "Not paid yet. Ready to pay.", { canPay: true });
      return;
    }
    prepare();
  });

  newOrder.addEventListener("click", async () => {
    // A new order is the only way to pay again: the shop opens one, the page moves to it.
    newOrder.disabled = true;
    try {
      const response = await loggedFetch("/api/orders", { method: "POST" });
      if (response.ok) return location.assign((await response.json()).url);
    } catch {
      // the shop is unreachable: stay here
    }
    newOrder.disabled = false;
    note("page: could not open a new order");
  });

  // Back/Forward may restore this page from memory: ask the shop what became of the order.
  window.addEventListener("pageshow", async (event) => {
    if (!event.persisted || paid) return;
    const current = await orderStatus();
    if (current?.status === "paid") showPaid(current.charge);
  });

  newOrder.disabled = false;
  if (paid) showPaid(order.charge);
  else prepare();
}
