-- tenure's tables and functions in PostgreSQL.
--
-- `{S}` stands for the schema (`tenure` unless `?schema=` says otherwise), `{V}` for
-- the version. The backend runs this file, in one transaction under an advisory lock,
-- when the schema is missing or older: every statement creates what is missing or
-- replaces a function, so the file upgrades any older version. A DBA may run it by
-- hand instead (replace `{S}` and `{V}`) and give the backend's role only EXECUTE on
-- the functions and SELECT on the tables.
--
-- Rules every function keeps:
-- * Expiry is decided by the server's clock: a session lives while
--   `expires_at > clock_timestamp()`; everything it holds counts only while it lives.
-- * Whatever changes one election's seat or queue first takes that election's
--   advisory transaction lock (`lock`), so such changes run one at a time, each
--   seeing what the one before committed. A function that takes several takes
--   them ordered by `hashtext(election)`, so two of them never deadlock, and takes
--   at most a batch of them (the client's 128), so one transaction never needs more
--   locks than the server's lock table holds.
-- * The partial unique index `candidacies_one_holder` keeps two holders of one
--   election out whatever the functions do.
-- * A wake-up is a hint: `grant` decides, under the lock.

CREATE SCHEMA IF NOT EXISTS {S};

CREATE TABLE IF NOT EXISTS {S}.meta (version int NOT NULL);

CREATE TABLE IF NOT EXISTS {S}.sessions (
    id text PRIMARY KEY,
    channel text NOT NULL,          -- where its backend LISTENs
    ttl_ms bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_expiry ON {S}.sessions (expires_at);

CREATE SEQUENCE IF NOT EXISTS {S}.tokens;
CREATE SEQUENCE IF NOT EXISTS {S}.arrivals;

-- One row per candidacy: a waiter (token null) or the holder.
CREATE TABLE IF NOT EXISTS {S}.candidacies (
    election text NOT NULL,
    session text NOT NULL,
    candidate text NOT NULL,
    value text NOT NULL,
    priority int NOT NULL,
    preemptible boolean NOT NULL,
    arrival bigint NOT NULL DEFAULT nextval('{S}.arrivals'),
    token bigint,
    told boolean NOT NULL DEFAULT false,   -- the holder was asked to step down
    chosen boolean NOT NULL DEFAULT false, -- a handover named this waiter
    PRIMARY KEY (election, session)
);
CREATE UNIQUE INDEX IF NOT EXISTS candidacies_one_holder
    ON {S}.candidacies (election) WHERE token IS NOT NULL;
CREATE INDEX IF NOT EXISTS candidacies_session ON {S}.candidacies (session);
CREATE INDEX IF NOT EXISTS candidacies_told ON {S}.candidacies (session) WHERE told;

CREATE TABLE IF NOT EXISTS {S}.members (
    namespace text NOT NULL,
    id text NOT NULL,
    session text NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (namespace, id)
);
CREATE INDEX IF NOT EXISTS members_session ON {S}.members (session);

-- The channel observers of an election ('e') or a namespace ('m') LISTEN on.
CREATE OR REPLACE FUNCTION {S}.chan(kind text, name text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 't' || md5('{S}:' || kind || ':' || name) $$;

CREATE OR REPLACE FUNCTION {S}.lock(e text) RETURNS void LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(hashtext('{S}'), hashtext(e))
$$;

CREATE OR REPLACE FUNCTION {S}.live(sid text) RETURNS boolean LANGUAGE sql VOLATILE AS $$
    SELECT EXISTS (SELECT 1 FROM {S}.sessions WHERE id = sid AND expires_at > clock_timestamp())
$$;

CREATE OR REPLACE FUNCTION {S}.check_live(sid text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT {S}.live(sid) THEN
        RAISE EXCEPTION 'the session has expired' USING ERRCODE = 'TN001';
    END IF;
END $$;

-- Under e's lock, after a candidacy left: drop the candidacies of dead sessions, tell
-- e's observers if the holder was one of them, and wake the first waiter.
CREATE OR REPLACE FUNCTION {S}.settle(e text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    held boolean;
    w record;
BEGIN
    WITH dead AS (
        DELETE FROM {S}.candidacies c WHERE c.election = e AND NOT {S}.live(c.session)
        RETURNING c.token)
    SELECT bool_or(dead.token IS NOT NULL) INTO held FROM dead;
    IF held THEN
        PERFORM pg_notify({S}.chan('e', e), '');
    END IF;
    -- Wake the first waiter: it takes a free seat, or, with the seat held, learns that
    -- it is first now and looks again at the holder's expiry.
    SELECT c.session, s.channel INTO w
        FROM {S}.candidacies c JOIN {S}.sessions s ON s.id = c.session
        WHERE c.election = e AND c.token IS NULL
        ORDER BY c.chosen DESC, c.priority DESC, c.arrival LIMIT 1;
    IF FOUND THEN
        PERFORM pg_notify(w.channel, 'w ' || w.session || ' ' || e);
    END IF;
END $$;

-- Withdraw the candidacies of the sessions `gone` for e (with tok, only the grant
-- with that token), then settle e.
CREATE OR REPLACE FUNCTION {S}.withdraw(e text, gone text[], tok bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    held boolean;
BEGIN
    PERFORM {S}.lock(e);
    WITH d AS (
        DELETE FROM {S}.candidacies c
        WHERE c.election = e AND c.session = ANY (gone) AND (tok IS NULL OR c.token = tok)
        RETURNING c.token)
    SELECT bool_or(d.token IS NOT NULL) INTO held FROM d;
    IF held THEN
        PERFORM pg_notify({S}.chan('e', e), '');
    END IF;
    IF held IS NOT NULL THEN
        PERFORM {S}.settle(e);
    END IF;
END $$;

-- Take e's seat for session sid if it is next. Returns the token when granted;
-- otherwise wait_ms, the time until the holder's session expires, when sid is next.
CREATE OR REPLACE FUNCTION {S}.grant(e text, sid text, OUT token bigint, OUT wait_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    held timestamptz;
BEGIN
    PERFORM {S}.lock(e);
    PERFORM {S}.check_live(sid);
    DELETE FROM {S}.candidacies c WHERE c.election = e AND NOT {S}.live(c.session)
        AND c.token IS NOT NULL;
    IF FOUND THEN
        PERFORM pg_notify({S}.chan('e', e), '');
    END IF;
    SELECT c.token INTO token FROM {S}.candidacies c WHERE c.election = e AND c.session = sid;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the candidacy was withdrawn' USING ERRCODE = 'TN003';
    END IF;
    IF token IS NOT NULL THEN
        RETURN;
    END IF;
    IF (SELECT c.session FROM {S}.candidacies c
            WHERE c.election = e AND c.token IS NULL AND {S}.live(c.session)
            ORDER BY c.chosen DESC, c.priority DESC, c.arrival LIMIT 1) <> sid THEN
        RETURN;
    END IF;
    SELECT s.expires_at INTO held FROM {S}.candidacies c JOIN {S}.sessions s ON s.id = c.session
        WHERE c.election = e AND c.token IS NOT NULL;
    IF FOUND THEN
        wait_ms := greatest(0, ceil(extract(epoch FROM held - clock_timestamp()) * 1000));
        RETURN;
    END IF;
    UPDATE {S}.candidacies c SET token = nextval('{S}.tokens'), chosen = false
        WHERE c.election = e AND c.session = sid RETURNING c.token INTO token;
    PERFORM pg_notify({S}.chan('e', e), '');
END $$;

-- Queue session sid for e (or update its candidacy), preempt a holder of a lower
-- priority that did not opt out, then try to take the seat.
CREATE OR REPLACE FUNCTION {S}.join(e text, sid text, cand text, val text, prio int,
    preempt boolean, OUT token bigint, OUT wait_ms bigint) LANGUAGE plpgsql AS $$
DECLARE
    h record;
BEGIN
    PERFORM {S}.lock(e);
    PERFORM {S}.check_live(sid);
    INSERT INTO {S}.candidacies (election, session, candidate, value, priority, preemptible)
        VALUES (e, sid, cand, val, prio, preempt)
        ON CONFLICT (election, session) DO UPDATE
        SET candidate = cand, value = val, priority = prio, preemptible = preempt;
    SELECT c.session, c.token, s.channel INTO h
        FROM {S}.candidacies c JOIN {S}.sessions s ON s.id = c.session
        WHERE c.election = e AND c.token IS NOT NULL AND c.session <> sid
          AND s.expires_at > clock_timestamp() AND c.preemptible AND NOT c.told AND c.priority < prio;
    IF FOUND THEN
        UPDATE {S}.candidacies SET told = true WHERE election = e AND session = h.session;
        PERFORM pg_notify(h.channel, 'p ' || h.session || ' ' || h.token || ' ' || e);
    END IF;
    SELECT g.token, g.wait_ms INTO token, wait_ms FROM {S}.grant(e, sid) g;
END $$;

-- Take e's seat only if no other live session holds it or queues for it.
CREATE OR REPLACE FUNCTION {S}.try_take(e text, sid text, cand text, val text, prio int,
    preempt boolean) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    t bigint;
BEGIN
    PERFORM {S}.lock(e);
    PERFORM {S}.check_live(sid);
    IF EXISTS (SELECT 1 FROM {S}.candidacies c
            WHERE c.election = e AND c.session <> sid AND {S}.live(c.session)) THEN
        RETURN NULL;
    END IF;
    DELETE FROM {S}.candidacies c WHERE c.election = e AND c.session <> sid;
    INSERT INTO {S}.candidacies AS c (election, session, candidate, value, priority,
            preemptible, token)
        VALUES (e, sid, cand, val, prio, preempt, nextval('{S}.tokens'))
        ON CONFLICT (election, session) DO UPDATE
        SET token = coalesce(c.token, excluded.token)
        RETURNING c.token INTO t;
    PERFORM pg_notify({S}.chan('e', e), '');
    RETURN t;
END $$;

CREATE OR REPLACE FUNCTION {S}.try_many(es text[], sid text, cands text[], vals text[],
    prios int[], preempts boolean[]) RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    i bigint;
    answers bigint[] := array_fill(NULL::bigint, ARRAY[cardinality(es)]);
BEGIN
    FOR i IN SELECT n FROM unnest(es) WITH ORDINALITY AS t(e, n) ORDER BY hashtext(t.e), t.e
    LOOP
        answers[i] := {S}.try_take(es[i], sid, cands[i], vals[i], prios[i], preempts[i]);
    END LOOP;
    RETURN answers;
END $$;

CREATE OR REPLACE FUNCTION {S}.resign_many(es text[], sid text, toks bigint[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    i bigint;
BEGIN
    FOR i IN SELECT n FROM unnest(es) WITH ORDINALITY AS t(e, n) ORDER BY hashtext(t.e), t.e
    LOOP
        PERFORM {S}.withdraw(es[i], ARRAY[sid], toks[i]);
    END LOOP;
END $$;

-- Clear away a dead session, at most `lim` of its candidacies per call (each election
-- locked in turn, in lock order, so that one transaction never needs more locks than
-- PostgreSQL's lock table holds): `sid`, or with null one that expired and that no
-- other caller is clearing. Once it holds nothing, its members and its row go.
-- Returns whether to call again.
CREATE OR REPLACE FUNCTION {S}.reap(sid text, lim int) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    victim text;
    e text;
    ns text;
BEGIN
    IF sid IS NULL THEN
        SELECT s.id INTO victim FROM {S}.sessions s WHERE s.expires_at <= clock_timestamp()
            ORDER BY s.expires_at LIMIT 1 FOR UPDATE SKIP LOCKED;
    ELSE
        SELECT s.id INTO victim FROM {S}.sessions s WHERE s.id = sid FOR UPDATE;
    END IF;
    IF victim IS NULL THEN
        RETURN false;
    END IF;
    FOR e IN SELECT d.election FROM (SELECT c.election FROM {S}.candidacies c
            WHERE c.session = victim LIMIT lim) d ORDER BY hashtext(d.election), d.election
    LOOP
        PERFORM {S}.withdraw(e, ARRAY[victim], NULL);
    END LOOP;
    IF EXISTS (SELECT 1 FROM {S}.candidacies c WHERE c.session = victim) THEN
        RETURN true;
    END IF;
    FOR ns IN WITH m AS (DELETE FROM {S}.members m WHERE m.session = victim
            RETURNING m.namespace) SELECT DISTINCT m.namespace FROM m
    LOOP
        PERFORM pg_notify({S}.chan('m', ns), '');
    END LOOP;
    DELETE FROM {S}.sessions WHERE id = victim;
    RETURN sid IS NULL;
END $$;

CREATE OR REPLACE FUNCTION {S}.open(sid text, chan text, ttl bigint) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO {S}.sessions (id, channel, ttl_ms, expires_at)
        VALUES (sid, chan, ttl, clock_timestamp() + ttl * interval '1 millisecond')
$$;

-- Renew sid; returns the seats sid was asked to give up, and whether some session has
-- expired and waits to be cleared away (`reap`).
CREATE OR REPLACE FUNCTION {S}.renew(sid text, OUT elections text[], OUT tokens bigint[],
    OUT dead boolean) LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {S}.sessions s SET expires_at = clock_timestamp() + s.ttl_ms * interval '1 millisecond'
        WHERE s.id = sid AND s.expires_at > clock_timestamp();
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the session has expired' USING ERRCODE = 'TN001';
    END IF;
    SELECT array_agg(c.election), array_agg(c.token) INTO elections, tokens
        FROM {S}.candidacies c WHERE c.session = sid AND c.told AND c.token IS NOT NULL;
    dead := EXISTS (SELECT 1 FROM {S}.sessions s WHERE s.expires_at <= clock_timestamp());
END $$;

-- End sid now (it is dead to every other statement from here on) and clear the first
-- part of it away; returns whether `reap(sid, …)` must be called again.
CREATE OR REPLACE FUNCTION {S}.close(sid text, lim int) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {S}.sessions SET expires_at = clock_timestamp() WHERE id = sid;
    RETURN {S}.reap(sid, lim);
END $$;

-- Ask e's holder to step down to waiter `target` (any waiter if null). Returns the
-- holder asked.
CREATE OR REPLACE FUNCTION {S}.handover(e text, target text, OUT candidate text,
    OUT value text, OUT token bigint) LANGUAGE plpgsql AS $$
DECLARE
    h record;
BEGIN
    PERFORM {S}.lock(e);
    SELECT c.session, c.candidate, c.value, c.token, s.channel INTO h
        FROM {S}.candidacies c JOIN {S}.sessions s ON s.id = c.session
        WHERE c.election = e AND c.token IS NOT NULL AND s.expires_at > clock_timestamp();
    IF NOT FOUND THEN
        RAISE EXCEPTION 'handover of %: nobody leads it', e USING ERRCODE = 'TN002';
    END IF;
    IF target IS NULL THEN
        IF NOT EXISTS (SELECT 1 FROM {S}.candidacies c
                WHERE c.election = e AND c.token IS NULL AND {S}.live(c.session)) THEN
            RAISE EXCEPTION 'handover of %: nobody waits for it', e USING ERRCODE = 'TN002';
        END IF;
    ELSE
        IF NOT EXISTS (SELECT 1 FROM {S}.candidacies c WHERE c.election = e
                AND c.token IS NULL AND c.candidate = target AND {S}.live(c.session)) THEN
            RAISE EXCEPTION 'handover of %: candidate % does not wait for it', e, target
                USING ERRCODE = 'TN002';
        END IF;
        UPDATE {S}.candidacies c SET chosen = (c.candidate = target)
            WHERE c.election = e AND c.token IS NULL;
    END IF;
    UPDATE {S}.candidacies c SET told = true WHERE c.election = e AND c.session = h.session;
    PERFORM pg_notify(h.channel, 'p ' || h.session || ' ' || h.token || ' ' || e);
    candidate := h.candidate;
    value := h.value;
    token := h.token;
END $$;

CREATE OR REPLACE FUNCTION {S}.register(ns text, sid text, mid text, val text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {S}.check_live(sid);
    INSERT INTO {S}.members (namespace, id, session, value) VALUES (ns, mid, sid, val)
        ON CONFLICT (namespace, id) DO UPDATE SET session = sid, value = val;
    PERFORM pg_notify({S}.chan('m', ns), '');
END $$;

CREATE OR REPLACE FUNCTION {S}.unregister(ns text, sid text, mid text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {S}.members WHERE namespace = ns AND id = mid AND session = sid;
    IF FOUND THEN
        PERFORM pg_notify({S}.chan('m', ns), '');
    END IF;
END $$;

-- The version this file brings the schema to (`{V}`: the crate's SCHEMA version).
DELETE FROM {S}.meta;
INSERT INTO {S}.meta (version) VALUES ({V});
