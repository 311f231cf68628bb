/*
 * The lease protocol of one idempotency record, as a Promela model for the
 * spin model checker. `make model` checks it (scripts/check-model.sh);
 * docs/reliability.md, "The lease protocol, model-checked", says what it
 * proves and what it leaves out.
 *
 * The actors, one process each:
 *
 *   C1, C2      two copies of one request: same caller, same key, same
 *               body (fingerprint 1);
 *   C3          the same key with another body (fingerprint 2);
 *   R           the reconciler: finishes what nobody holds;
 *   Sweeper     deletes completed records;
 *   Clock       the database clock: leases lapse;
 *   Invariants  checks, in every state, what must always hold.
 *
 * Every SQL statement is one atomic step: PostgreSQL runs it on one row,
 * under the row's lock, so nobody sees it half done. A transaction that
 * ends in a fenced update (a phase) is one step too: if the fence matches
 * no row, the whole transaction rolls back, so it happens entirely or not
 * at all. Between two steps anything may happen: another process runs,
 * this one crashes, or it stalls while its lease runs out.
 *
 * Time is abstract. The Clock may end a lease at any moment, whatever its
 * holder is doing. That covers a crash (nobody renews any more), a stall
 * of any length (a GC pause, a slow network) and a lease that simply ran
 * out. So every write must be safe even from a writer that has been asleep
 * for an unknown time: that is what the fencing token is for.
 *
 * One bound keeps the model finite: a lease may lapse under a holder that
 * is still at work (a stall) at most MAXSTALLS times in a run. Without it,
 * the Clock could end every lease the moment it is taken, for ever, and
 * the attempt counter would grow without end. A lease whose holder has
 * stopped (crashed, gave up, finished) may always lapse. Every behaviour
 * with up to MAXSTALLS stalls is checked, each stall at any moment.
 *
 * The reconciler's schedule (next_attempt_at) is not modelled: the
 * reconciler may take a lapsed record over at any moment after the lapse.
 * That includes every moment its schedule would allow, so what is safe
 * here is safe with any schedule; a schedule only delays.
 *
 * Switches (spin -DNAME):
 *   NO_FENCE        the planted bug: the completion forgets `attempt = a`.
 *                   The safety run must fail.
 *   NO_DEADLINE     a waiter waits as long as it takes (no 409 at
 *                   IDEMPOTENCY_WAIT). The liveness runs use it, so that
 *                   "a waiter is answered" is not true merely because the
 *                   deadline always comes.
 *   NO_TIMER        a waiter wakes only on a NOTIFY. With NO_DEADLINE the
 *                   liveness run fails: a NOTIFY can be lost, and a crash
 *                   sends none.
 *   FRESH_EFFECT    also assert that the processor's effect a record gets
 *                   was made for that record, not replayed from an older
 *                   record of the same key. It fails with the target's
 *                   downstream key; it holds with KEY_PER_RECORD.
 *   KEY_PER_RECORD  derive the downstream key from the record's id
 *                   instead of (caller, key, fingerprint).
 *   MAXSTALLS=n     allow n stalls instead of 2.
 */

#define NCLIENTS  3
#define MAXLIFE   3 /* records the key may have, one after another: each client inserts at most once */
#define MAXREC    1 /* the reconciler sets a record aside on its second takeover (reconciler_attempts > 1) */
#define MAXRCRASH 1 /* the reconciler's process may die (and restart) once */
#ifndef MAXSTALLS
#define MAXSTALLS 2 /* leases that may lapse under a holder still at work */
#endif

mtype = {
	in_progress, completed, dead,      /* status */
	started, charge_created, finished, /* recovery_point */
	C1, C2, C3, R                      /* names, for the trails */
};

/*
 * The downstream key sent to the processor. The target derives it from
 * (caller, key, request fingerprint); with one caller and one key, the
 * fingerprint names it. Every attempt of a record computes the same key
 * from the request alone, without reading what an earlier attempt wrote.
 */
#ifdef KEY_PER_RECORD
#define DK(f, rid) (rid)
#else
#define DK(f, rid) (f)
#endif

/* ---- The row: idempotency_keys for (caller, key). ---- */

bool  exists;  /* there is a row for the key */
byte  id;      /* the row's id: every insert makes a new one (a new life of the key) */
mtype status;
mtype rp;      /* recovery_point */
byte  attempt; /* the fencing token */
byte  fp;      /* request_fingerprint: 1 or 2 */
bool  live;    /* locked_until > now(): a lease is running */
byte  recon;   /* reconciler_attempts */
byte  charge;  /* the charge row its phase 1 created: that owner's attempt (0: none) */
byte  resp;    /* the stored response: the charge it describes (0: none) */
byte  nextid;  /* the last id handed out: a sequence never reuses a value */

/* ---- LISTEN/NOTIFY, per client. ---- */

bool listening[NCLIENTS + 1]; /* the client is registered as a waiter */
bool notified[NCLIENTS + 1];  /* a NOTIFY reached it, and it has not woken for it yet */

/* ---- The processor: one effect per downstream key. ---- */

byte effect_of[MAXLIFE + 1]; /* per downstream key: the record whose call made the effect (0: none) */

/*
 * ---- Ghost state: the protocol never reads it. ----
 *
 * owner is the process that acquired the current row's lease last, by
 * insert or by takeover. It is kept apart from `attempt` on purpose: the
 * assertions check that the attempt fence really means "the last one to
 * acquire", instead of assuming it.
 */
byte owner;
/* The Clock reads these two, to bound the stalls (see the header). */
bool holder_up; /* owner is still running (not crashed, not stopped) */
byte stalls;    /* leases that lapsed under a running holder so far */
/* For the assertions, per record id, never erased, not even when the row
 * is deleted: */
bool completed_once[MAXLIFE + 1]; /* it was completed */
byte answer_of[MAXLIFE + 1];      /* the response its completion stored */
byte dk_of[MAXLIFE + 1];          /* the downstream key its first processor call used */
byte effects[MAXLIFE + 1];        /* effects the processor made for it */

/*
 * The fence: the row is still this owner's, at attempt a. It names the
 * row's id as well as the attempt: after a delete, a new record of the
 * same key starts again at attempt 1, and only the id tells them apart
 * (the SQL names both: `WHERE ... id = @id AND attempt = @attempt`).
 */
#define HOLDS(rid, a) (exists && id == rid && attempt == a && status == in_progress)

/* The completion's fence. NO_FENCE drops `attempt = a` from it, and from
 * nothing else: the id, status and lease checks stay. */
#ifdef NO_FENCE
#define COMPLETE_FENCE(rid, a) (exists && id == rid && status == in_progress && live)
#else
#define COMPLETE_FENCE(rid, a) (HOLDS(rid, a) && live)
#endif

/* A DELETE of the row. Zeroing every field keeps "no row" one state. */
#define CLEAR_ROW \
	exists = false; id = 0; status = 0; rp = 0; attempt = 0; fp = 0; live = false; \
	recon = 0; charge = 0; resp = 0; owner = 0; holder_up = false

/*
 * NOTIFY, from a transaction that completes, buries, abandons or releases
 * the record. PostgreSQL delivers it only when that transaction commits,
 * which is why it is sent inside the committing step and nowhere else.
 * Each listener may miss it (its connection dropped), so no waiter may
 * depend on one.
 */
#define NOTIFY_ONE(i) \
	if \
	:: listening[i] -> \
		if \
		:: notified[i] = true; printf("   NOTIFY reaches C%d\n", i) \
		:: printf("   NOTIFY to C%d is lost\n", i) \
		fi \
	:: else \
	fi
#define NOTIFY NOTIFY_ONE(1); NOTIFY_ONE(2); NOTIFY_ONE(3)

/*
 * The processor call, made outside any transaction. The processor
 * collapses every call with one downstream key into one effect, and
 * replays its answer to the later ones. Asserted: a record is only ever
 * sent under one downstream key, and gets at most one effect.
 */
#ifdef FRESH_EFFECT
#define FRESH(k, rid) assert(effect_of[k] == rid)
#else
#define FRESH(k, rid) skip
#endif
#define PROCESSOR(k, rid) \
	atomic { \
		if \
		:: dk_of[rid] == 0 -> dk_of[rid] = k \
		:: else -> assert(dk_of[rid] == k) \
		fi; \
		if \
		:: effect_of[k] == 0 -> \
			effect_of[k] = rid; effects[rid]++; \
			printf("%e: processor call for record %d, downstream key %d: the effect happens\n", who, rid, k) \
		:: else -> \
			printf("%e: processor call for record %d, downstream key %d: replayed, no new effect\n", who, rid, k) \
		fi; \
		assert(effects[rid] <= 1); \
		FRESH(k, rid) \
	}

/*
 * What may happen between two steps of an owner:
 *   - nothing: it carries on;
 *   - it crashes: it stops for good, renews and releases nothing, and its
 *     lease lapses when the Clock says so;
 *   - its heartbeat runs: `UPDATE SET locked_until = now() + L WHERE id AND
 *     attempt = a AND status = 'in_progress' AND locked_until >
 *     clock_timestamp()`. One row: the lease goes on (time is abstract, so
 *     nothing changes here). Zero rows: the lease is lost, and the owner
 *     stops before its next write. The conditions are why a renewal can
 *     never revive a lease that already ran out, or extend one that is now
 *     someone else's.
 * canCrash bounds the reconciler's crashes. A client crashes at most once
 * anyway: its request is then over.
 */
#define BETWEEN(rid, a, canCrash) \
	if \
	:: skip \
	:: canCrash -> goto crashed \
	:: atomic { \
		HOLDS(rid, a) && live -> \
		printf("%e: heartbeat renews the lease of record %d (attempt %d)\n", who, rid, a); \
		assert(owner == _pid); \
		live = true \
	   } \
	:: atomic { \
		!(HOLDS(rid, a) && live) -> \
		printf("%e: heartbeat renews zero rows: lease lost, stop\n", who); \
		goto lost \
	   } \
	fi

/*
 * The processor's answer was lost (a timeout): the outcome is uncertain.
 * Give the lease up: `SET locked_until = now(), next_attempt_at = ...
 * WHERE id AND attempt = a AND status = 'in_progress'`. No lease check: a
 * lapsed owner may still hand back what nobody took. The record keeps its
 * recovery point; waiters are told.
 */
#define RELEASE(rid, a) \
	atomic { \
		printf("%e: the processor's answer is lost\n", who); \
		if \
		:: HOLDS(rid, a) -> \
			printf("%e: release record %d (attempt %d)\n", who, rid, a); \
			assert(owner == _pid); \
			live = false; \
			NOTIFY \
		:: else \
		fi \
	}

/*
 * The final phase, one transaction: record the answer, store the response
 * and complete, fenced like every phase. completed_once and answer_of are
 * history that no delete erases: a record is completed at most once, and
 * its response is the one that completion stored.
 */
#define COMPLETE(rid, a) \
	atomic { \
		if \
		:: COMPLETE_FENCE(rid, a) -> \
			printf("%e: completion commits on record %d under attempt %d (the record's attempt is %d): response = charge %d\n", \
			       who, rid, a, attempt, charge); \
			assert(owner == _pid); \
			assert(!completed_once[rid]); \
			completed_once[rid] = true; answer_of[rid] = charge; \
			status = completed; rp = finished; resp = charge; live = false; \
			NOTIFY \
		:: else -> printf("%e: completion updates zero rows: roll back, stop\n", who); goto lost \
		fi \
	}

/*
 * A client request with the key and body myfp. It ends with an answer
 * (its own response, a replay, a 422, a refusal, a 409 at its deadline),
 * or with nothing (it crashed).
 */
proctype Client(mtype who; byte me; byte myfp)
{
	byte  rid; /* the record it holds, or read */
	byte  a;   /* the attempt it holds (its fencing token), or read */
	mtype p;   /* the recovery point it resumes from */

	/*
	 * The claim: INSERT ... ON CONFLICT DO NOTHING, returning the row
	 * that was there otherwise, in one statement. Nobody owns by reading:
	 * only by this insert, or by the conditional takeover below.
	 */
claim:
	atomic {
		if
		:: !exists ->
			assert(nextid < MAXLIFE);
			nextid++;
			exists = true; id = nextid; status = in_progress; rp = started; attempt = 1; fp = myfp;
			live = true; recon = 0; charge = 0; resp = 0;
			owner = _pid; holder_up = true; rid = id; a = 1; p = started;
			listening[me] = false; notified[me] = false;
			printf("%e: claim inserts record %d, attempt 1\n", who, rid);
			goto own
		:: exists && fp != myfp ->
			/* Another request under this key: a 422. Never its
			 * answer, never its ownership. */
			printf("%e: claim finds another request's record %d: 422\n", who, id);
			goto done
		:: exists && fp == myfp && status == completed && !listening[me] ->
			/* The stored response, once and for all. */
			assert(resp != 0 && resp == answer_of[id]);
			printf("%e: claim replays record %d: charge %d\n", who, id, resp);
			goto done
		:: exists && fp == myfp && status == completed && listening[me] ->
			/* A waiter's replay: what it waited for. Whatever woke
			 * it, it answers the record's one stored response. */
			assert(resp != 0 && resp == answer_of[id]);
			printf("%e: the waiter's claim replays record %d: charge %d\n", who, id, resp);
			goto done
		:: exists && fp == myfp && status == dead ->
			printf("%e: claim finds record %d set aside: refused\n", who, id);
			goto done
		:: exists && fp == myfp && status == in_progress && !live ->
			/* Nobody holds it. Remember what was read; the takeover
			 * is a second statement. */
			rid = id; a = attempt;
			printf("%e: claim finds record %d in progress, its lease lapsed (attempt %d)\n", who, rid, a)
		:: exists && fp == myfp && status == in_progress && live ->
			goto wait
		fi
	}

	/*
	 * The takeover: `UPDATE SET attempt = attempt + 1, locked_until =
	 * now() + L WHERE id AND attempt = <read> AND status = 'in_progress'
	 * AND locked_until <= now()`. The WHERE repeats everything the claim
	 * read, because anything may have happened since: of several racing
	 * takeovers exactly one matches.
	 */
	atomic {
		if
		:: exists && id == rid && attempt == a && status == in_progress && !live ->
			attempt++; live = true;
			owner = _pid; holder_up = true; a = attempt; p = rp;
			listening[me] = false; notified[me] = false;
			printf("%e: takes over record %d: attempt %d, from %e\n", who, rid, a, p)
		:: else ->
			/* Someone else got it first: wait for what becomes of it. */
			printf("%e: takeover updates zero rows: someone was first\n", who);
			rid = 0; a = 0;
			goto wait
		fi
	}

own:
	if
	:: p == started -> goto phase1
	:: p == charge_created -> goto call
	fi;

	/*
	 * Phase 1, one transaction: insert the local charge row (with its
	 * downstream key), then `SET recovery_point = 'charge_created' WHERE id
	 * AND attempt = a AND status = 'in_progress' AND locked_until >
	 * clock_timestamp()`. Zero rows: the charge row rolls back with it.
	 */
phase1:
	BETWEEN(rid, a, true);
	atomic {
		if
		:: HOLDS(rid, a) && live ->
			printf("%e: phase 1 commits on record %d (attempt %d): charge %d, charge_created\n", who, rid, a, a);
			assert(owner == _pid);
			charge = a; rp = charge_created
		:: else -> printf("%e: phase 1 updates zero rows: roll back, stop\n", who); goto lost
		fi
	}

	/*
	 * The processor call, outside any transaction. This owner may already
	 * be fenced out without knowing it; the call is made all the same,
	 * and the downstream key is what keeps it from being a second effect.
	 */
call:
	BETWEEN(rid, a, true);
	PROCESSOR(DK(myfp, rid), rid);
	if
	:: RELEASE(rid, a); goto done
	:: true
	fi;
	BETWEEN(rid, a, true);
	COMPLETE(rid, a);
	goto done;

	/*
	 * In progress under a live lease: wait. First LISTEN, then read again.
	 * A NOTIFY committed between the first claim and the LISTEN was not
	 * heard, so only a read made after registering can be trusted.
	 */
wait:
	if
	:: !listening[me] ->
		listening[me] = true;
		printf("%e: record in progress under a live lease: LISTEN, claim again\n", who);
		goto claim
	:: else
	fi;
	/* Asleep. Every wake runs the claim again: it may replay, take over,
	 * or wait again. */
	printf("%e: waits\n", who);
	if
	:: notified[me] -> notified[me] = false; printf("%e: woken by a NOTIFY\n", who)
#ifndef NO_TIMER
	:: true -> printf("%e: woken by the timer\n", who)
#endif
#ifndef NO_DEADLINE
	:: true -> printf("%e: deadline: 409 in progress, retry after\n", who); goto done
#endif
	fi;
	goto claim;

	/* It lost the lease: it stops and answers with what the record says
	 * (which answer does not matter here). */
lost:
	goto done;

	/* Its process died: no answer at all. */
crashed:
	printf("%e: crashes\n", who);

done:
	/* Forget everything, so that finished requests are one state
	 * whatever their story. */
	atomic {
		if
		:: owner == _pid -> holder_up = false /* its lease may now lapse freely */
		:: else
		fi;
		listening[me] = false; notified[me] = false; rid = 0; a = 0; p = 0
	}
}

/*
 * The reconciler: takes over what nobody holds, and drives it like an
 * owner would. It runs for ever; a crash is a restart.
 */
proctype Reconciler(mtype who)
{
	byte  rid, a, f, tries;
	mtype p;
	byte  crashes;

	/*
	 * ClaimStale: `... WHERE status = 'in_progress' AND locked_until <=
	 * now() (AND next_attempt_at <= now()) FOR UPDATE SKIP LOCKED`, then
	 * `SET attempt = attempt + 1, reconciler_attempts = reconciler_attempts
	 * + 1, locked_until = now() + L`. One statement: nothing comes between
	 * the check and the takeover.
	 */
end_idle:
	atomic {
		exists && status == in_progress && !live ->
		attempt++; recon++; live = true; owner = _pid; holder_up = true;
		rid = id; a = attempt; f = fp; p = rp; tries = recon;
		printf("%e: takes over record %d: attempt %d, from %e, its try %d\n", who, rid, a, p, tries)
	}
	if
	:: tries > MAXREC -> goto bury
	:: else ->
		if
		:: p == started -> goto abandon
		:: p == charge_created -> goto call
		fi
	fi;

	/* Tried too often: set it aside for a person. `SET status = 'dead'
	 * WHERE id AND attempt = a AND status = 'in_progress'`. */
bury:
	BETWEEN(rid, a, crashes < MAXRCRASH);
	atomic {
		if
		:: HOLDS(rid, a) ->
			printf("%e: buries record %d\n", who, rid);
			assert(owner == _pid);
			status = dead; live = false;
			NOTIFY
		:: else -> printf("%e: bury deletes zero rows\n", who)
		fi
	}
	goto next;

	/* Still at `started`: its phase 1 never committed, so nothing
	 * happened, here or at the processor. Free the key: `DELETE WHERE id
	 * AND attempt = a AND status = 'in_progress' AND recovery_point =
	 * 'started'`. */
abandon:
	BETWEEN(rid, a, crashes < MAXRCRASH);
	atomic {
		if
		:: HOLDS(rid, a) && rp == started ->
			printf("%e: abandons record %d\n", who, rid);
			assert(owner == _pid);
			assert(effects[rid] == 0);
			CLEAR_ROW;
			NOTIFY
		:: else -> printf("%e: abandon deletes zero rows\n", who)
		fi
	}
	goto next;

	/* Past phase 1: call the processor and finish, as a client owner
	 * would. The downstream key comes from the record's fingerprint. */
call:
	BETWEEN(rid, a, crashes < MAXRCRASH);
	PROCESSOR(DK(f, rid), rid);
	if
	:: RELEASE(rid, a); goto next
	:: true
	fi;
	BETWEEN(rid, a, crashes < MAXRCRASH);
	COMPLETE(rid, a);
	goto next;

crashed:
	crashes++;
	printf("%e: crashes and restarts\n", who);
lost:
next:
	atomic {
		if
		:: owner == _pid -> holder_up = false
		:: else
		fi;
		rid = 0; a = 0; f = 0; p = 0; tries = 0;
		goto end_idle
	}
}

/*
 * The sweeper deletes completed records past the retention window (here:
 * at any time after completion), and never one in progress or dead. After
 * that the key names a new operation.
 */
proctype Sweeper()
{
end_sweep:
	do
	:: atomic {
		exists && status == completed ->
		printf("sweeper: deletes record %d\n", id);
		CLEAR_ROW
	   }
	od
}

/*
 * The database clock. A lease in progress may lapse at any moment (a
 * crash, a stall, or just time); a lapse under a holder still at work is a
 * stall and counts against MAXSTALLS.
 */
proctype Clock()
{
end_tick:
	do
	:: atomic {
		exists && status == in_progress && live && (!holder_up || stalls < MAXSTALLS) ->
		if
		:: holder_up -> stalls++; printf("clock: the lease of record %d lapses while its holder works (a stall)\n", id)
		:: else -> printf("clock: the lease of record %d lapses (its holder has stopped)\n", id)
		fi;
		live = false
	   }
	od
}

/*
 * What must hold in every state. The process is blocked unless it fails,
 * so it adds no states.
 *   - A completed record's response is the one its completion stored.
 *   - A record past phase 1 has its charge row.
 *   - Only a record in progress has a running lease.
 *   - No record ever got two effects.
 */
#define INVARIANT ( \
	(!(exists && status == completed) || (resp != 0 && resp == answer_of[id])) && \
	(!(exists && rp == charge_created) || charge != 0) && \
	(!live || (exists && status == in_progress)) && \
	effects[1] <= 1 && effects[2] <= 1 && effects[3] <= 1)

proctype Invariants()
{
end_watch:
	atomic { !INVARIANT -> assert(INVARIANT) }
}

init {
	atomic {
		run Client(C1, 1, 1); /* pid 1 */
		run Client(C2, 2, 1); /* pid 2 */
		run Client(C3, 3, 2); /* pid 3 */
		run Reconciler(R);    /* pid 4 */
		run Sweeper();
		run Clock();
		run Invariants()
	}
}

/*
 * Liveness, under weak fairness (pan -a -f -N name): every process that
 * can move keeps moving.
 *
 * resumed: a record nobody holds (in progress, lease lapsed) does not stay
 * so for ever: it is taken over (by the reconciler, or a client), or its
 * last holder buries or abandons it.
 *
 * answered: a waiter does not wait for ever: it replays, takes over, or
 * is refused (or gets its 409, but the liveness runs take the deadline
 * away).
 */
#define stale (exists && status == in_progress && !live)
ltl resumed { [] (stale -> <> !stale) }
ltl answered {
	[] ((listening[1] -> <> !listening[1]) &&
	    (listening[2] -> <> !listening[2]) &&
	    (listening[3] -> <> !listening[3]))
}
