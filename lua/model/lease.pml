/*
 * lua/model/lease.pml: the token record's state machine as the scripts beside it run it,
 * and the clients that drive it, for the Spin model checker (docs/architecture.md, "The
 * protocol, model-checked"; tests/model/ runs it in `make test`).
 *
 * One record, as in Redis: its state letter and the fields the protocol decides on (the byte
 * layouts, lua/_record.lua's, are below the model: a field is a field). Each script is one
 * `atomic` step (a Lua script runs alone in Redis), and so is the keyed claim's one plain
 * command (store.py: SET key <PROCESSING> NX GET PX lease_ms, CLAIM below). Time is not counted: a
 * lease runs out, a token's own expiry passes and a finished record's TTL ends as events
 * that can happen between any two steps, whatever the renewer does; once passed, an expiry
 * stays passed (Redis TIME never goes back).
 *
 * Every change of state is MOVE(script, from, to): Spin checks that `from` is the state the
 * record is in, and tests/model/test_drift.py reads the MOVE lines as this model's transition
 * table and compares it with the `-- transitions:` line of each script (0: no record).
 *
 *   -DKEYED      a keyed operation (@idempotent, keyed_guard): the plain claim, then begin.lua
 *                when the record it found does not decide alone; begin claims an absent record
 *                (claim_ms); the lease is the key's own expiry (the record vanishes with it);
 *                no consumer; finished records are kept for the whole check. An
 *                Idempotency-Key request (the WSGI/ASGI/Django middlewares) is one: the same
 *                record under its own key, its fingerprint the binding, each attempt's owner id
 *                the lease id, the stored response the result; its release (fail, retryable,
 *                kept 0 ms) is lua_fail's P->0 move (retryable, the claim's own life over)
 *   -DSTEP       the scripts only, without the clients (tests/model/test_conformance.py)
 *   -DMUTANT=n   a deliberately broken protocol, which the check must refute:
 *                1 complete without the lease-id check, 2 begin takes over a live lease,
 *                3 renew brings an expired lease back, 4 consume takes over a live lease
 */

#ifndef MUTANT
#define MUTANT 0
#endif

/* states: the record's letter (its first byte, as a character code: a trail prints it with
 * %c); NONE ('0') is no record: never issued, ran out, or deleted */
#define NONE 48
#define I 73 /* ISSUED */
#define P 80 /* PROCESSING */
#define C 67 /* CONSUMED */
#define S 83 /* SUCCEEDED */
#define F 70 /* FAILED */

/* who moves the record: a script of lua/, or the clock (a key's PX running out) */
mtype = { ISSUE, CONSUME, BEGIN, CLAIM, RENEW, COMPLETE, FAIL, REVOKE, EXPIRE }

/* the scripts' replies */
mtype:reply = {
  R_NONE,
  R_INVALID,         /* token_invalid */
  R_USED,            /* token_used */
  R_FAILED,          /* token_failed, or fail's 'failed' */
  R_IN_PROGRESS,     /* token_in_progress */
  R_CONSUMED,        /* consumed, replayed 0 */
  R_CONSUMED_AGAIN,  /* consumed, replayed 1 */
  R_STARTED,         /* started: a new lease, or the same one to a retry of its begin */
  R_SUCCEEDED,       /* begin: a finished operation's result; complete: stored, replayed 0 */
  R_SUCCEEDED_AGAIN, /* complete, replayed 1 */
  R_RENEWED,
  R_LEASE_LOST,
  R_RELEASED,
  R_RELEASED_AGAIN,
  R_FAILED_AGAIN
}

#define NGUARDS 2
#define CONSUMER_REQUEST 9 /* the consumer's request id; a guard's is its number, 1 or 2 */
#define OPERATOR 0         /* the admin tools' release: fail with the record's own lease id */

#define MOVE(script, from, to) assert(st == from); st = to; printf("  record %c -> %c by ", from, to); printm(script); printf("\n")

/* The record (one Redis string key). */
byte st = NONE;          /* the state letter */
byte req = 0;            /* field 4 request_id */
byte lease = 0;          /* field 5 lease_id */
bool lease_live = false; /* field 6 lease_expires_ms is still ahead (PROCESSING) */
bool tok_live = false;   /* the token's own expiry (the key's PX; field 7 while PROCESSING) is ahead */

/* Ghost state: what the properties speak of. */
byte next_lease = 0;        /* lease ids drawn so far: every begin draws a new one */
byte lid[NGUARDS + 1];      /* the last lease granted to guard g (even when its reply was lost) */
bool valid[NGUARDS + 1];    /* guard g's lease has been the record's live lease ever since it was granted */
byte recorded = 0;          /* outcomes stored: a consume's win, a complete, a terminal fail */
byte effects = 0;           /* bodies that ran to their end: the operation's side effect */
byte lapses = 0;            /* live leases ended by the clock or an operator, not by their holder */
byte releases = 0;          /* leases their holder released for a retry (a retryable failure) */
bool issued = false;
bool revoked = false;
bool operator_released = false;

/* After any step: the guards whose lease stopped being the record's live one. Only the clock
 * and the operators (`by_env`) may end a lease its holder did not end itself. */
inline settle(by_env) {
  if
  :: valid[1] && !(st == P && lease == lid[1] && lease_live) ->
     valid[1] = false; lapses++;
     if :: !by_env -> printf("a client ended guard 1's live lease\n") :: else fi;
     assert(by_env)
  :: else
  fi;
  if
  :: valid[2] && !(st == P && lease == lid[2] && lease_live) ->
     valid[2] = false; lapses++;
     if :: !by_env -> printf("a client ended guard 2's live lease\n") :: else fi;
     assert(by_env)
  :: else
  fi
}

inline clear() {
  req = 0; lease = 0; lease_live = false
}

/* A fresh lease for guard g: nobody else may hold a live one, and no outcome may be stored. */
inline grant(g, r, out) {
  assert(!valid[1] && !valid[2]);
  assert(recorded == 0);
  next_lease++;
  lease = next_lease; req = g; lease_live = true;
  lid[g] = lease; valid[g] = true;
  out = lease; r = R_STARTED
}

inline record_outcome() {
  assert(recorded == 0);
  recorded++
}

/* ---- the scripts ---------------------------------------------------------------------- */

/* lua/issue.lua: SET NX of a fresh key */
inline lua_issue() {
  MOVE(ISSUE, NONE, I); tok_live = true; issued = true
}

/* lua/consume.lua with request id rq */
inline lua_consume(rq, r) {
  if
  :: st == NONE -> r = R_INVALID
  :: st == C && req == rq -> r = R_CONSUMED_AGAIN
  :: st == C && req != rq -> r = R_USED
  :: st == S -> r = R_USED
  :: st == F -> r = R_FAILED
  :: st == I -> MOVE(CONSUME, I, C); clear(); req = rq; record_outcome(); r = R_CONSUMED
#if MUTANT == 4
  :: st == P && tok_live -> MOVE(CONSUME, P, C); clear(); req = rq; record_outcome(); r = R_CONSUMED
#else
  :: st == P && lease_live -> r = R_IN_PROGRESS
  :: st == P && !lease_live && tok_live ->
     /* the holder's lease ran out: the token is usable again until its own expiry */
     MOVE(CONSUME, P, C); clear(); req = rq; record_outcome(); r = R_CONSUMED
#endif
  :: st == P && !lease_live && !tok_live -> MOVE(CONSUME, P, NONE); clear(); r = R_INVALID
  fi;
  settle(false)
}

/* lua/begin.lua for guard g (its request id is g); out: the lease id it is told */
inline lua_begin(g, r, out) {
  if
  :: st == NONE ->
#ifdef KEYED
     MOVE(BEGIN, NONE, P); tok_live = true; grant(g, r, out)  /* claim_ms: claimed afresh */
#else
     r = R_INVALID
#endif
  :: st == S -> r = R_SUCCEEDED
  :: st == F -> r = R_FAILED
  :: st == C -> r = R_USED
  :: st == I -> MOVE(BEGIN, I, P); grant(g, r, out)
  :: st == P && lease_live && req == g -> out = lease; r = R_STARTED  /* a retry of its begin */
#if MUTANT == 2
  :: st == P && lease_live && req != g -> MOVE(BEGIN, P, P); grant(g, r, out)
#else
  :: st == P && lease_live && req != g -> r = R_IN_PROGRESS
#endif
  :: st == P && !lease_live && tok_live -> MOVE(BEGIN, P, P); grant(g, r, out)  /* take over, fence by lease id */
  :: st == P && !lease_live && !tok_live ->
#ifdef KEYED
     MOVE(BEGIN, P, P); tok_live = true; grant(g, r, out)  /* a keyed operation is claimed afresh */
#else
     MOVE(BEGIN, P, NONE); clear(); r = R_INVALID
#endif
  fi;
  settle(false)
}

/* store.py's keyed claim (TokenStore._claim): one SET NX GET PX lease_ms. An absent record is
 * claimed (the lease: the key's own expiry); the record found is returned unchanged, and the
 * client decides a finished one (records.claim_reply: the result, the failure) and hands any
 * other to begin.lua, a step of its own: the record may change in between. */
inline plain_claim(g, r, out, decided) {
  decided = true;
  if
  :: st == NONE -> MOVE(CLAIM, NONE, P); tok_live = true; grant(g, r, out)
  :: st == S -> r = R_SUCCEEDED
  :: st == F -> r = R_FAILED
  :: else -> decided = false
  fi;
  settle(false)
}

/* lua/renew.lua by guard g with lease id l */
inline lua_renew(g, l, r) {
  if
  :: st == NONE -> r = R_INVALID
#if MUTANT == 3
  :: st == P && lease == l -> MOVE(RENEW, P, P); lease_live = true; r = R_RENEWED
#else
  :: st == P && lease == l && lease_live -> MOVE(RENEW, P, P); r = R_RENEWED  /* never shortened */
#endif
  :: else -> r = R_LEASE_LOST
  fi;
  if
  :: r == R_RENEWED -> assert(valid[g])  /* only the holder of a live lease renews it */
  :: else
  fi;
  settle(false)
}

/* lua/complete.lua by guard g with lease id l */
inline lua_complete(g, l, r) {
  if
  :: st == NONE -> r = R_INVALID
  :: st == S && lease == l -> r = R_SUCCEEDED_AGAIN  /* a retry of this very complete */
#if MUTANT == 1
  :: st == P && lease_live ->
#else
  :: st == P && lease == l && lease_live ->
#endif
     assert(valid[g]);  /* no fenced-out holder records a result */
     MOVE(COMPLETE, P, S); lease_live = false; valid[g] = false;
     record_outcome(); r = R_SUCCEEDED
  :: else -> r = R_LEASE_LOST
  fi;
  settle(false)
}

/* lua/fail.lua by guard g (OPERATOR: the admin tools) with lease id l */
inline lua_fail(g, l, retryable, r) {
  if
  :: st == NONE -> r = R_INVALID
  :: st == F && lease == l -> r = R_FAILED_AGAIN
  :: st == I && lease == l && retryable -> r = R_RELEASED_AGAIN
  :: st == P && lease == l && lease_live ->
     assert(g == OPERATOR || valid[g]);  /* no fenced-out holder records a failure */
     if
     :: g != OPERATOR -> valid[g] = false
     :: else
     fi;
     if
     :: retryable && tok_live ->
        MOVE(FAIL, P, I); req = 0; lease_live = false; r = R_RELEASED  /* remembers the lease */
     :: retryable && !tok_live -> MOVE(FAIL, P, NONE); clear(); r = R_RELEASED
     :: !retryable -> MOVE(FAIL, P, F); lease_live = false; record_outcome(); r = R_FAILED
     fi;
     if
     :: g != OPERATOR && r == R_RELEASED -> releases++
     :: else
     fi
  :: else -> r = R_LEASE_LOST
  fi;
  settle(g == OPERATOR)
}

/* lua/revoke.lua */
inline lua_revoke() {
  if
  :: st == I -> MOVE(REVOKE, I, NONE)
  :: st == P -> MOVE(REVOKE, P, NONE)
  :: st == C -> MOVE(REVOKE, C, NONE)
  :: st == S -> MOVE(REVOKE, S, NONE)
  :: st == F -> MOVE(REVOKE, F, NONE)
  fi;
  clear();
  settle(true)
}

/* ---- the clients -------------------------------------------------------------------- */

/* (-DSTEP leaves them out: tests/model/test_conformance.py runs the scripts above one step
 * at a time, from every state, beside the Lua scripts themselves) */
#ifndef STEP

/* The guard's renewer: renewals while the guard holds its lease, as many as the interleaving
 * gives, or none (a renewer delayed past the lease, stopped, or dropped with its guard).
 * A renewal changes nothing this model counts (a lease may run out at any point anyway),
 * so renewing at the guard's own steps reaches every state a renewer thread would renew
 * in; it stops at the first refusal, as the SDK's renewer does. */
inline renewals(g, l, r) {
  do
  :: atomic { lua_renew(g, l, r); if :: r != R_RENEWED -> r = R_NONE; break :: else -> r = R_NONE fi }
  :: break
  od
}

/* A guard (Guard.run): begin, renew while the body runs, then complete or fail. It may
 * crash between any two steps (a crash is a holder that never takes another step). */
proctype Guard(byte g; byte tries) {
  mtype:reply r = R_NONE;
  byte mine = 0;     /* the lease id it was told */
  byte begins = 0;
  mtype outcome = COMPLETE; /* what its body came to: COMPLETE, or FAIL */
  bool retryable = false;   /* ... after an exception not declared terminal */
  mtype:reply first = R_NONE;
  bool decided = false;

again:
#ifdef KEYED
  atomic { plain_claim(g, r, mine, decided) };
  if
  :: !decided -> atomic { lua_begin(g, r, mine) }
  :: else
  fi;
#else
  atomic { lua_begin(g, r, mine) };
#endif
  atomic {
    begins++;
    printf("guard %d: begin -> %e (lease %d)\n", g, r, mine);
    if
    :: begins < tries -> goto again  /* its reply was lost, or a poll while in progress */
    :: r != R_STARTED -> goto done   /* a replay, a conflict, or no such token */
    :: r == R_STARTED -> assert(mine == lid[g]); r = R_NONE
    fi
  }
  renewals(g, mine, r);
  /* the body: the operation's side effect */
  if
  :: goto done  /* crashed before its side effect */
  :: atomic {
       effects++;
       printf("guard %d: the body runs (side effects: %d)\n", g, effects);
       /* the side effect happens again only after a lease lapsed or was released */
       assert(effects <= 1 + lapses + releases)
     }
  fi;
  renewals(g, mine, r);
  atomic {
    if
    :: goto done  /* crashed after its side effect, before storing the outcome */
    :: outcome = COMPLETE; lua_complete(g, mine, r)
    :: outcome = FAIL; retryable = true; lua_fail(g, mine, true, r)  /* the body raised: released */
    :: outcome = FAIL; lua_fail(g, mine, false, r)  /* a terminal error: the failure is recorded */
    fi;
    printf("guard %d: %e with lease %d (retryable %d) -> %e\n", g, outcome, mine, retryable, r);
    first = r
  }
  /* a retry of the same call (its reply was lost): the first answer stands */
  atomic {
    if
    :: tries >= 2 && outcome == COMPLETE -> lua_complete(g, mine, r);
       assert(first != R_SUCCEEDED || r == R_SUCCEEDED_AGAIN || r == R_INVALID)
    :: tries >= 2 && outcome == FAIL && retryable -> lua_fail(g, mine, true, r);
       assert(first != R_RELEASED || r == R_RELEASED_AGAIN || r == R_INVALID || r == R_LEASE_LOST)
    :: tries >= 2 && outcome == FAIL && !retryable -> lua_fail(g, mine, false, r);
       assert(first != R_FAILED || r == R_FAILED_AGAIN || r == R_INVALID)
    :: true  /* no reply was lost (the duplicate's never are) */
    fi;
    r = R_NONE
  }
done:
  r = R_NONE; first = R_NONE; outcome = COMPLETE; retryable = false
}

#ifndef KEYED
/* A one-shot consume, retried with the same request id (a lost reply, or after a conflict). */
proctype Consumer() {
  mtype:reply r = R_NONE;
  byte tries = 0;
  bool won = false;
again:
  atomic { lua_consume(CONSUMER_REQUEST, r); tries++; printf("consumer: consume -> %e\n", r) };
  if
  :: won -> assert(r == R_CONSUMED_AGAIN || r == R_INVALID)  /* the same win, or the token is gone */
  :: else
  fi;
  if
  :: r == R_CONSUMED -> won = true
  :: else
  fi;
  if
  :: tries < 2 -> goto again
  :: true
  fi
}
#endif

/* The clock and the operators: at any point, any expiry that is due may pass. */
proctype Environment() {
  mtype:reply r = R_NONE;
end:
  do
  :: atomic {
       st == P && lease_live ->
       lease_live = false;
       printf("clock: lease %d runs out\n", lease);
       settle(true)
     }
  :: atomic {
       tok_live ->
       tok_live = false;
       printf("clock: the token's own expiry passes\n");
       if
       :: st == I -> MOVE(EXPIRE, I, NONE); clear()
       :: st == C -> MOVE(EXPIRE, C, NONE); clear()
       :: else  /* PROCESSING lives for its lease; a finished record for its result_ttl */
       fi;
       settle(true)
     }
  :: atomic { st == P && !lease_live && !tok_live -> MOVE(EXPIRE, P, NONE); clear() }
#ifdef KEYED
  /* a keyed claim's record is its lease: the key's PX ends both at once */
  :: atomic {
       st == P && lease_live ->
       lease_live = false;
       printf("clock: lease %d runs out with its key\n", lease);
       MOVE(EXPIRE, P, NONE); clear();
       settle(true)
     }
#endif
#ifndef KEYED
  :: atomic { st == S && !tok_live -> MOVE(EXPIRE, S, NONE); clear() }
  :: atomic { st == F && !tok_live -> MOVE(EXPIRE, F, NONE); clear() }
  :: atomic { !revoked && st != NONE -> revoked = true; printf("operator: revoke\n"); lua_revoke() }
#endif
  :: atomic { !operator_released && st == P && lease_live ->
       operator_released = true; printf("operator: release lease %d\n", lease);
       lua_fail(OPERATOR, lease, true, r); r = R_NONE }
  od
}

init {
  atomic {
#ifndef KEYED
    lua_issue();
#endif
    run Environment();
    run Guard(1, 2);  /* the holder: one lost reply of each call, retried */
    run Guard(2, 1);  /* the duplicate */
#ifndef KEYED
    run Consumer();
#endif
  }
}

/* The temporal property (the assertions above are checked in the same run): a finished or
 * consumed record never changes again but to vanish, and a token once gone never comes back. */
ltl terminal {
  [] ((st == S -> [] (st == S || st == NONE)) &&
      (st == F -> [] (st == F || st == NONE)) &&
#ifndef KEYED
      (issued && st == NONE -> [] (st == NONE)) &&
#endif
      (st == C -> [] (st == C || st == NONE)))
}
#endif
