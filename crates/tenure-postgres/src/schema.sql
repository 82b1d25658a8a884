-- tenure's tables and functions in PostgreSQL: a store of the election engine's
-- primitives (sessions, one conditional write, a read), with no election rule in it.
--
-- `{S}` stands for the schema (`tenure` unless `?schema=` says otherwise), `{V}` for
-- the version. The backend runs this file, in one transaction under an advisory lock,
-- when the schema is missing or older: it drops the schema's functions and creates
-- them again, and creates the tables that are missing, so the file upgrades any older
-- version (version 1's candidacies go: stop the old backends before the upgrade). A
-- DBA may run it by hand instead (replace `{S}` and `{V}`) and give the backend's role
-- only EXECUTE on the functions and SELECT on the tables.
--
-- * Expiry is decided by the server's clock: a session lives while
--   `expires_at > clock_timestamp()`. Records of an ended session stay, reported dead,
--   until a write of the engine's deletes them.
-- * A write locks its election's row (`FOR UPDATE`) and commits only if the election
--   is still at the revision it was decided on (no row: revision 0). Revisions, record
--   arrivals and tokens come from sequences, so each only grows.
-- * A committed write notifies the backends of the sessions with records in the
--   election (`e REVISION SESSIONS SNAPSHOT ELECTION`: whose records it changed, a
--   deleted one marked `-`, and the election after it as `commit` writes it, `-` when
--   the note would be too long) and the election's own channel (`chan`, for
--   observers); an ended session notifies every backend (`s SESSION`).

CREATE SCHEMA IF NOT EXISTS {S};

CREATE TABLE IF NOT EXISTS {S}.meta (version int NOT NULL);

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p WHERE p.pronamespace = '{S}'::regnamespace
    LOOP
        EXECUTE 'DROP FUNCTION ' || f;
    END LOOP;
END $$;
DROP TABLE IF EXISTS {S}.candidacies;

CREATE TABLE IF NOT EXISTS {S}.sessions (
    id text PRIMARY KEY,
    channel text NOT NULL,          -- where its backend LISTENs
    ttl_ms bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_expiry ON {S}.sessions (expires_at);

CREATE SEQUENCE IF NOT EXISTS {S}.tokens;
CREATE SEQUENCE IF NOT EXISTS {S}.arrivals;
CREATE SEQUENCE IF NOT EXISTS {S}.revisions;

-- An election with records (or a kept state): its revision, and the state kept for
-- its next grant (the engine's bytes; empty: none).
CREATE TABLE IF NOT EXISTS {S}.elections (
    name text PRIMARY KEY,
    revision bigint NOT NULL,
    kept bytea NOT NULL DEFAULT ''
);

-- One record per session and election: the fields the store manages, and the
-- engine's opaque body.
CREATE TABLE IF NOT EXISTS {S}.records (
    election text NOT NULL,
    session text NOT NULL,
    arrival bigint NOT NULL,
    version bigint NOT NULL,
    token bigint,
    body bytea NOT NULL,
    PRIMARY KEY (election, session)
);
CREATE INDEX IF NOT EXISTS records_session ON {S}.records (session);
-- Whatever a write does, at most one record of an election carries a token (a write
-- deletes before it puts, so a write that moves the token passes).
CREATE UNIQUE INDEX IF NOT EXISTS records_one_token ON {S}.records (election)
    WHERE token IS NOT NULL;

CREATE TABLE IF NOT EXISTS {S}.members (
    namespace text NOT NULL,
    id text NOT NULL,
    session text NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (namespace, id)
);
CREATE INDEX IF NOT EXISTS members_session ON {S}.members (session);

-- The channel observers of an election ('e') or a namespace ('m') LISTEN on.
CREATE FUNCTION {S}.chan(kind text, name text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 't' || md5('{S}:' || kind || ':' || name) $$;

-- Elections `es` as they stand, one row each in the order of `es` (`n`): the revision,
-- `snap`, the election as notes carry it (no spaces: the kept state in hex, then per
-- record `/session,arrival,version,token,live,ms,body`, live 1 or 0, ms how long its
-- session still lives, body in hex), and the channels of the backends of its sessions.
CREATE FUNCTION {S}.read(es text[]) RETURNS TABLE (n int, revision bigint, snap text,
    channels text[])
LANGUAGE sql STABLE AS $$
    SELECT x.n::int, coalesce(e.revision, 0), encode(coalesce(e.kept, ''), 'hex')
        || coalesce(string_agg('/' || concat_ws(',', r.session, r.arrival, r.version,
            coalesce(r.token::text, ''), coalesce(s.expires_at > clock_timestamp(), false)::int,
            greatest(0, coalesce(ceil(extract(epoch FROM s.expires_at - clock_timestamp())
                * 1000), 0))::int8, encode(r.body, 'hex')), '')
            FILTER (WHERE r.session IS NOT NULL), ''),
        array_agg(s.channel) FILTER (WHERE s.channel IS NOT NULL)
    FROM unnest(es) WITH ORDINALITY AS x(name, n)
    LEFT JOIN {S}.elections e ON e.name = x.name
    LEFT JOIN {S}.records r ON r.election = x.name
    LEFT JOIN {S}.sessions s ON s.id = r.session
    GROUP BY x.n, e.name ORDER BY x.n
$$;

-- Commit writes, each to its own election `es[i]` only if that election is still at
-- `revs[i]`, all of its ops or none: ops `j` with `ws[j] = i`, each of kind 'n' (put a
-- record without a token), 'k' (put, keeping token `toks[j]`), 'm' (put with a new
-- token), 't' (touch: a new version) or 'd' (delete), for session `sids[j]` with body
-- `bodies[j]`; `keeps[i]` replaces the election's kept state (null: leave it). A write
-- that puts or touches a record of an ended session does not commit, nor does a second
-- write to the same election. Returns, per write, whether it committed (`done`) and the
-- election after, as `read` gives it. Election rows are locked in name order; deletes go
-- before puts. Its statements run on generic plans: planned again for every call's
-- arrays (the default, custom plans), they took about 0.6 of its 1.4 ms.
CREATE FUNCTION {S}.commit(es text[], revs bigint[], keeps bytea[], ws int[],
    kinds "char"[], sids text[], toks bigint[], bodies bytea[])
RETURNS TABLE (n int, done boolean, revision bigint, snap text)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    ok boolean[];
    revised bigint[];
BEGIN
    INSERT INTO {S}.elections AS el (name, revision)
        SELECT DISTINCT x.name, 0::bigint FROM unnest(es) AS x(name) ORDER BY 1
        ON CONFLICT DO NOTHING;
    PERFORM 1 FROM {S}.elections el WHERE el.name = ANY (es) ORDER BY el.name FOR UPDATE;
    SELECT array_agg(el.revision = x.rev
            AND x.n = (SELECT min(y.n) FROM unnest(es) WITH ORDINALITY AS y(name, n)
                WHERE y.name = x.name)
            AND NOT EXISTS (SELECT 1 FROM unnest(ws, kinds, sids) AS o(w, k, s)
                LEFT JOIN {S}.sessions s ON s.id = o.s AND s.expires_at > clock_timestamp()
                WHERE o.w = x.n AND o.k <> 'd' AND s.id IS NULL)
            ORDER BY x.n) INTO ok
        FROM unnest(es, revs) WITH ORDINALITY AS x(name, rev, n)
        JOIN {S}.elections el ON el.name = x.name;
    SELECT array_agg(CASE WHEN ok[x.n] THEN nextval('{S}.revisions') END ORDER BY x.n)
        INTO revised FROM generate_series(1, cardinality(es)) AS x(n);
    UPDATE {S}.elections el SET revision = revised[x.n], kept = coalesce(keeps[x.n], el.kept)
        FROM unnest(es) WITH ORDINALITY AS x(name, n)
        WHERE ok[x.n] AND el.name = x.name;
    DELETE FROM {S}.records r USING unnest(ws, kinds, sids) AS o(w, k, s)
        WHERE o.k = 'd' AND ok[o.w] AND r.election = es[o.w] AND r.session = o.s;
    UPDATE {S}.records r SET version = revised[o.w] FROM unnest(ws, kinds, sids) AS o(w, k, s)
        WHERE o.k = 't' AND ok[o.w] AND r.election = es[o.w] AND r.session = o.s;
    INSERT INTO {S}.records AS r (election, session, arrival, version, token, body)
        SELECT es[o.w], o.s, nextval('{S}.arrivals'), revised[o.w],
            CASE o.k WHEN 'k' THEN o.t WHEN 'm' THEN nextval('{S}.tokens') END, o.b
        FROM unnest(ws, kinds, sids, toks, bodies) WITH ORDINALITY AS o(w, k, s, t, b, j)
        WHERE o.k IN ('n', 'k', 'm') AND ok[o.w] ORDER BY o.j
        ON CONFLICT (election, session) DO UPDATE
        SET version = excluded.version, token = excluded.token, body = excluded.body;
    DELETE FROM {S}.elections el WHERE el.name = ANY (es) AND el.kept = ''
        AND NOT EXISTS (SELECT 1 FROM {S}.records r WHERE r.election = el.name);
    -- The elections after, read once: returned, and each one written told to its
    -- followers and to the backends of the sessions with records in it or deleted from it.
    RETURN QUERY WITH now AS MATERIALIZED (SELECT * FROM {S}.read(es)),
    notes AS MATERIALIZED (SELECT w.n, w.channels, 'e ' || revised[w.n] || ' ' || CASE
            WHEN octet_length(w.names) + octet_length(w.snap) + octet_length(es[w.n]) < 7900
                THEN w.names || ' ' || w.snap
            WHEN octet_length(w.names) + octet_length(es[w.n]) < 7900 THEN w.names || ' -'
            ELSE '* -' END || ' ' || es[w.n] AS note
        FROM (SELECT now.*, coalesce((SELECT string_agg(DISTINCT
                CASE o.k WHEN 'd' THEN '-' || o.s ELSE o.s END, ',')
                FROM unnest(ws, kinds, sids) AS o(w, k, s) WHERE o.w = now.n), '') AS names
            FROM now WHERE ok[now.n]) w),
    sent AS (SELECT count(pg_notify(c.channel, c.note)) FROM (
        SELECT unnest(x.channels) AS channel, x.note FROM notes x
        UNION SELECT s.channel, x.note FROM notes x
            JOIN unnest(ws, kinds, sids) AS o(w, k, s) ON o.w = x.n AND o.k = 'd'
            JOIN {S}.sessions s ON s.id = o.s
        UNION SELECT {S}.chan('e', es[x.n]), '' FROM notes x) c)
    SELECT w.n, ok[w.n], w.revision, w.snap FROM now w, sent ORDER BY w.n;
END $$;

-- Whether what a waiter waits for in e happened after revision `seen`: the record of
-- `me` changed or went, or the record of `ahead` went or its session ended (with
-- neither, the election moved); and the milliseconds until `ahead`'s session expires.
CREATE FUNCTION {S}.changed(e text, me text, ahead text, seen bigint, OUT done boolean,
    OUT wait_ms bigint) LANGUAGE sql STABLE AS $$
    SELECT (me IS NULL AND ahead IS NULL
            AND coalesce((SELECT el.revision FROM {S}.elections el WHERE el.name = e), 0) <> seen)
        OR (me IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {S}.records r
            WHERE r.election = e AND r.session = me AND r.version <= seen))
        OR (ahead IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {S}.records r
            JOIN {S}.sessions s ON s.id = r.session
            WHERE r.election = e AND r.session = ahead AND s.expires_at > clock_timestamp())),
        (SELECT ceil(extract(epoch FROM s.expires_at - clock_timestamp()) * 1000)::int8
            FROM {S}.sessions s WHERE s.id = ahead)
$$;

CREATE FUNCTION {S}.open(sid text, chan text, ttl bigint) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO {S}.sessions (id, channel, ttl_ms, expires_at)
        VALUES (sid, chan, ttl, clock_timestamp() + ttl * interval '1 millisecond')
$$;

-- Renew the live sessions of `sids`; whether each still lives.
CREATE FUNCTION {S}.renew(sids text[]) RETURNS boolean[] LANGUAGE sql AS $$
    WITH renewed AS (
        UPDATE {S}.sessions s SET expires_at = clock_timestamp() + s.ttl_ms * interval '1 millisecond'
        WHERE s.id = ANY (sids) AND s.expires_at > clock_timestamp() RETURNING s.id)
    SELECT coalesce(array_agg(x.id IN (SELECT id FROM renewed) ORDER BY x.n), '{}')
    FROM unnest(sids) WITH ORDINALITY AS x(id, n)
$$;

-- End sid now: its records count as dead from here on (the engine's writes clear them
-- away), its members go, and every backend hears of it. Sessions that ended an hour
-- ago or more, and their members, are cleared away too.
CREATE FUNCTION {S}.revoke(sid text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    ch text;
    ns text;
BEGIN
    UPDATE {S}.sessions SET expires_at = clock_timestamp() WHERE id = sid AND expires_at > clock_timestamp();
    FOR ns IN WITH m AS (DELETE FROM {S}.members m WHERE m.session = sid
            OR m.session IN (SELECT s.id FROM {S}.sessions s
                WHERE s.expires_at < clock_timestamp() - interval '1 hour')
            RETURNING m.namespace) SELECT DISTINCT m.namespace FROM m
    LOOP
        PERFORM pg_notify({S}.chan('m', ns), '');
    END LOOP;
    DELETE FROM {S}.sessions s WHERE s.expires_at < clock_timestamp() - interval '1 hour'
        AND NOT EXISTS (SELECT 1 FROM {S}.records r WHERE r.session = s.id);
    FOR ch IN SELECT DISTINCT s.channel FROM {S}.sessions s WHERE s.expires_at > clock_timestamp()
    LOOP
        PERFORM pg_notify(ch, 's ' || sid);
    END LOOP;
END $$;

CREATE FUNCTION {S}.register(ns text, sid text, mid text, val text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {S}.sessions s
            WHERE s.id = sid AND s.expires_at > clock_timestamp()) THEN
        RAISE EXCEPTION 'the session has expired' USING ERRCODE = 'TN001';
    END IF;
    INSERT INTO {S}.members (namespace, id, session, value) VALUES (ns, mid, sid, val)
        ON CONFLICT (namespace, id) DO UPDATE SET session = sid, value = val;
    PERFORM pg_notify({S}.chan('m', ns), '');
END $$;

CREATE FUNCTION {S}.unregister(ns text, sid text, mid text) RETURNS void
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
