-- The PostgreSQL ledger's tables, functions and triggers (schema.py applies them and says what
-- they guard; accountant.ledger.lanes says what the lanes are). Placeholders, in braces, filled by
-- schema.ddl: S the schema, S_LITERAL its quoted name as an SQL string, V the schema version,
-- TRIGGERS the trigger statements.
CREATE TABLE IF NOT EXISTS {S}.dpbudget_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS {S}.dpbudget_entries (
    seq BIGINT PRIMARY KEY, hash TEXT NOT NULL, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS {S}.dpbudget_accounts (
    key TEXT PRIMARY KEY, rule TEXT NOT NULL, config TEXT NOT NULL, state TEXT NOT NULL,
    seq BIGINT NOT NULL);
-- Each account's lane: the last record on it (format 2 records link to it). Written only by the
-- trigger dpbudget_entry_lanes, as the owner.
CREATE TABLE IF NOT EXISTS {S}.dpbudget_lanes (
    key TEXT PRIMARY KEY, seq BIGINT NOT NULL, hash TEXT NOT NULL);
CREATE SEQUENCE IF NOT EXISTS {S}.dpbudget_seq;
-- A random salt of the lanes' advisory lock ids (schema.lock_id), readable by the writers only.
CREATE TABLE IF NOT EXISTS {S}.dpbudget_salt (salt TEXT NOT NULL CHECK (salt <> ''));
CREATE UNIQUE INDEX IF NOT EXISTS dpbudget_salt_one ON {S}.dpbudget_salt ((true));
INSERT INTO {S}.dpbudget_salt SELECT gen_random_uuid()::text
    WHERE NOT EXISTS (SELECT 1 FROM {S}.dpbudget_salt);
-- Format 2 (linked per account): only a new, empty ledger becomes one here. A ledger made before
-- lanes is not upgraded in place (ledger.py refuses it: export, then import).
INSERT INTO {S}.dpbudget_meta SELECT 'format', '2'
    WHERE NOT EXISTS (SELECT 1 FROM {S}.dpbudget_entries) ON CONFLICT (key) DO NOTHING;

CREATE OR REPLACE FUNCTION {S}.dpbudget_append_only() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'dpbudget ledger: % on % refused: ledger entries are append-only, '
        'accounts are never removed and the lock salt never changes', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'check_violation';
END $$;

CREATE OR REPLACE FUNCTION {S}.dpbudget_entry_check() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, {S}, pg_temp AS $$
DECLARE
    v_rec jsonb;
    v_accounts jsonb;
    v_last bigint;
    v_prev text;
    v_lanes boolean;
    v_key text;
BEGIN
    -- Two statements read tables (each a round through the executor); the rest are expressions.
    v_rec := NEW.record::jsonb;
    IF jsonb_typeof(v_rec) IS DISTINCT FROM 'object' OR v_rec->'seq' IS DISTINCT FROM
            to_jsonb(NEW.seq) THEN
        RAISE EXCEPTION 'dpbudget ledger: entry % refused: its record is not an object with '
            'that seq', NEW.seq USING ERRCODE = 'check_violation';
    END IF;
    IF v_rec ? 'links' THEN
        -- Format 2: linked per account (dpbudget_entry_lanes checks the links); its seq was
        -- taken from dpbudget_seq, unless the owner numbered it (an import): a writer numbering
        -- records at will could exhaust the numbers or end a lane at the largest one.
        IF NEW.seq < 1 OR NEW.seq > coalesce(pg_sequence_last_value('dpbudget_seq'), 0)
                AND NOT pg_has_role(
                current_user, (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'MEMBER') THEN
            RAISE EXCEPTION 'dpbudget ledger: entry % refused: its seq was not taken from the '
                'ledger''s numbering', NEW.seq USING ERRCODE = 'check_violation';
        END IF;
    ELSE
        -- Format 1, one chain: only while the ledger is one (an import, an older writer). A
        -- concurrent writer's uncommitted entry is not seen, but the primary key refuses a twin.
        SELECT seq, hash, record::jsonb ? 'links' INTO v_last, v_prev, v_lanes
            FROM dpbudget_entries ORDER BY seq DESC LIMIT 1;
        IF NOT FOUND THEN
            v_last := 0;
            v_prev := repeat('0', 64);
        END IF;
        IF v_lanes THEN
            RAISE EXCEPTION 'dpbudget ledger: entry % refused: the ledger is linked per account '
                '(format 2) and this record is not', NEW.seq USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.seq <> v_last + 1 THEN
            RAISE EXCEPTION 'dpbudget ledger: entry % refused: the next entry is %', NEW.seq,
                v_last + 1 USING ERRCODE = 'check_violation';
        END IF;
        IF v_rec->'prev' IS DISTINCT FROM to_jsonb(v_prev) THEN
            RAISE EXCEPTION 'dpbudget ledger: entry % refused: its prev is not the hash of '
                'entry %', NEW.seq, v_last USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    IF length(NEW.hash) <> 64 OR ltrim(NEW.hash, '0123456789abcdef') <> '' THEN
        RAISE EXCEPTION 'dpbudget ledger: entry % refused: its hash is not 64 hex digits',
            NEW.seq USING ERRCODE = 'check_violation';
    END IF;
    -- The limits are the owner's: a policy record may come only from a member of the role that
    -- owns the tables (a writer's, raising the limits, would be a well-formed, linked append).
    IF v_rec->>'kind' = 'policy' AND NOT pg_has_role(current_user,
            (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'MEMBER') THEN
        RAISE EXCEPTION 'dpbudget ledger: entry % refused: only the ledger''s owner writes '
            'policy records', NEW.seq USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- A record is the analyst's who logged in (session_user, which SET ROLE does not change),
    -- never a name the client chose; only the owner writes records of others (an import).
    IF v_rec->'analyst' IS DISTINCT FROM to_jsonb(session_user::text) THEN
        IF NOT pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = TG_RELID),
                'MEMBER') THEN
            RAISE EXCEPTION 'dpbudget ledger: entry % refused: its analyst is not the role that '
                'logged in (%)', NEW.seq, session_user USING ERRCODE = 'insufficient_privilege';
        END IF;
    END IF;
    CASE coalesce(v_rec->>'auth', 'sha256')
        WHEN 'sha256' THEN
            IF NEW.hash <> encode(sha256(convert_to(NEW.record, 'UTF8')), 'hex') THEN
                RAISE EXCEPTION 'dpbudget ledger: entry % refused: its hash is not the SHA-256 '
                    'of its record', NEW.seq USING ERRCODE = 'check_violation';
            END IF;
        WHEN 'hmac-sha256' THEN
            NULL;  -- the key is not on the server: only an audit with the key checks it
        ELSE
            RAISE EXCEPTION 'dpbudget ledger: entry % refused: unknown auth', NEW.seq
                USING ERRCODE = 'check_violation';
    END CASE;
    v_accounts := coalesce(v_rec->'accounts', '{}');
    IF jsonb_typeof(v_accounts) <> 'object' THEN
        RAISE EXCEPTION 'dpbudget ledger: entry % refused: its accounts are not an object',
            NEW.seq USING ERRCODE = 'check_violation';
    END IF;
    -- Nor may it charge another analyst's quota: every per-analyst account it lists
    -- (analyst:<name>, dataset:<d>/analyst:<name>, a window's @... after it; policies.accounts)
    -- is session_user's, unless the owner writes it. Only a record that lists one pays the scan.
    -- Each account a rule's name and a state of numbers >= 0 (the row is written from it).
    -- A number above the largest double would be read back as infinity, or not at all.
    IF jsonb_path_exists(v_accounts, 'strict $.* ? (@.type() != "object" || @.rule.type() != '
            '"string" || @.state.type() != "object" || exists (@.state.* ? (@.type() != '
            '"number" || @ < 0 || @ > 1.7976931348623157e308)))', '{}', true) IS NOT FALSE THEN
        RAISE EXCEPTION 'dpbudget ledger: entry % refused: an account it lists has no rule or a '
            'state not made of finite numbers >= 0', NEW.seq USING ERRCODE = 'check_violation';
    END IF;
    -- The policy pointer (the account of rule 'policy') moves only with a policy record: a
    -- writer's record listing it would point every gate at a record that holds no policy.
    IF (v_accounts ? 'policy' OR jsonb_path_exists(v_accounts, '$.* ? (@.rule == "policy")'))
            AND NOT pg_has_role(current_user,
            (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'MEMBER') THEN
        RAISE EXCEPTION 'dpbudget ledger: entry % refused: only the ledger''s owner writes the '
            'policy account', NEW.seq USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF strpos(v_accounts::text, 'analyst:') > 0 THEN
        SELECT k INTO v_key FROM jsonb_object_keys(v_accounts) k
            WHERE substring(k FROM '(?:^|/)analyst:([^@/]*)') <> session_user::text LIMIT 1;
        IF v_key IS NOT NULL AND NOT pg_has_role(current_user,
                (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'MEMBER') THEN
            RAISE EXCEPTION 'dpbudget ledger: entry % refused: it charges account %, another '
                'analyst''s than the role that logged in (%)', NEW.seq, v_key, session_user
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    END IF;
    -- How a listed account may differ from its row, for every rule's state (the rules of
    -- accountant/composition): each member is a cost that never goes down (epsilon, delta, rho,
    -- approx, mu2, count, r0, r1, ...), except 'renyi''s order, the order its cost r0 is summed
    -- at: chosen by the first step, it is set only while every member is 0, then fixed (another
    -- order would read the same r0 as less spent: a refund). The rule never changes but by the
    -- owner (another rule reads the state otherwise, and the gates refuse the account).
    IF v_accounts <> '{}' THEN
        -- OFFSET 0 keeps one primary-key lookup per listed account, whatever the planner
        -- estimates for jsonb_each (a hash join would scan every account).
        SELECT a.key INTO v_key FROM jsonb_each(v_accounts) a,
            LATERAL (SELECT s.rule, s.state::jsonb AS state FROM dpbudget_accounts s
                     WHERE s.key = a.key OFFSET 0) s
            WHERE EXISTS (SELECT 1 FROM jsonb_each(s.state) o WHERE o.key <> 'order' AND
                    CASE WHEN jsonb_typeof(a.value->'state'->o.key) = 'number'
                              AND jsonb_typeof(o.value) = 'number'
                         THEN (a.value->'state'->o.key)::numeric < o.value::numeric
                         ELSE true END)
                OR (coalesce(a.value->'state'->'order', '0') <> coalesce(s.state->'order', '0')
                    AND jsonb_path_exists(s.state, '$.* ? (@ != 0)'))
                OR (a.value->>'rule' <> s.rule AND NOT pg_has_role(current_user,
                    (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'MEMBER'))
            LIMIT 1;
        IF v_key IS NOT NULL THEN
            RAISE EXCEPTION 'dpbudget ledger: entry % refused: it lists account % with a state '
                'below the stored one, another order or another rule', NEW.seq, v_key
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    RETURN NEW;
END $$;

-- An account row is written only by dpbudget_entry_lanes, from the record it follows (a row a
-- client wrote could stay behind its lane, and the next debit would read a refund): as the
-- tables' owner (the function is SECURITY DEFINER; a writer's own trigger, on a table of its
-- own, runs as the writer), and from a trigger (the owner's own UPDATE is refused too).
CREATE OR REPLACE FUNCTION {S}.dpbudget_account_check() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF pg_trigger_depth() < 2 OR NOT pg_has_role(current_user,
            (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'MEMBER') THEN
        RAISE EXCEPTION 'dpbudget ledger: account % refused: account rows are written only from '
            'the records appended to dpbudget_entries', NEW.key USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

-- After the row is in (as the owner: writers write neither lanes nor accounts): it writes the
-- account rows; a format 2 record must link, for every lane it is on, to that lane's last
-- record, and becomes it. A format 1 record moves its accounts' lanes to it.
CREATE OR REPLACE FUNCTION {S}.dpbudget_entry_lanes() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, {S}, pg_temp AS $$
DECLARE
    v_rec jsonb;
    v_links jsonb;
    v_key text;
    v_link jsonb;
BEGIN
    v_rec := NEW.record::jsonb;
    v_links := v_rec->'links';
    -- Each account row becomes what this record lists for it (dpbudget_entry_check refused a
    -- state below the stored one): a row never lags behind its lane.
    INSERT INTO dpbudget_accounts (key, rule, config, state, seq)
        SELECT a.key, a.value->>'rule', CASE a.value->>'rule' WHEN 'policy' THEN '{}' ELSE
            (a.value - 'state')::text END, (a.value->'state')::text, NEW.seq  -- (as the gate's)
        FROM jsonb_each(coalesce(v_rec->'accounts', '{}')) a
        ON CONFLICT (key) DO UPDATE SET rule = EXCLUDED.rule, config = EXCLUDED.config,
            state = EXCLUDED.state, seq = EXCLUDED.seq;
    IF v_links IS NULL THEN
        INSERT INTO dpbudget_lanes AS l SELECT k, NEW.seq, NEW.hash
            FROM jsonb_object_keys(coalesce(v_rec->'accounts', '{}')) k
            ON CONFLICT (key) DO UPDATE SET seq = EXCLUDED.seq, hash = EXCLUDED.hash;
        IF NEW.seq > coalesce(pg_sequence_last_value('dpbudget_seq'), 0) THEN
            PERFORM setval('dpbudget_seq', NEW.seq);  -- (the next one of one chain)
        END IF;
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v_links) <> 'object' OR v_links = '{}' OR EXISTS (
            SELECT 1 FROM jsonb_object_keys(coalesce(v_rec->'accounts', '{}')) k
            WHERE NOT v_links ? k) THEN
        RAISE EXCEPTION 'dpbudget ledger: entry % refused: its links do not name every account '
            'it lists', NEW.seq USING ERRCODE = 'check_violation';
    END IF;
    -- In key order (the writers' advisory locks are already held: this waits for nobody else).
    FOR v_key, v_link IN SELECT j.key, j.value FROM jsonb_each(v_links) j ORDER BY j.key LOOP
        IF jsonb_typeof(v_link) IS DISTINCT FROM 'array' OR jsonb_array_length(v_link) <> 2
                OR jsonb_typeof(v_link->0) <> 'number' OR jsonb_typeof(v_link->1) <> 'string' THEN
            RAISE EXCEPTION 'dpbudget ledger: entry % refused: its link for % is not [seq, '
                'hash]', NEW.seq, v_key USING ERRCODE = 'check_violation';
        END IF;
        UPDATE dpbudget_lanes SET seq = NEW.seq, hash = NEW.hash WHERE key = v_key
            AND seq = (v_link->>0)::numeric AND hash = v_link->>1 AND seq < NEW.seq;
        IF NOT FOUND AND v_link = jsonb_build_array(0, repeat('0', 64)) THEN
            -- A lane's first record: a row there already (someone else's first) is a conflict.
            INSERT INTO dpbudget_lanes VALUES (v_key, NEW.seq, NEW.hash) ON CONFLICT DO NOTHING;
        END IF;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'dpbudget ledger: entry % refused: its link for % is not the last '
                'record of that lane (another writer appended to it)', NEW.seq, v_key
                USING ERRCODE = 'check_violation';
        END IF;
    END LOOP;
    -- What it read without writing (the policy in force): still the last record there (under
    -- the shared lock its debit holds), and numbered before it.
    FOR v_key, v_link IN SELECT j.key, j.value FROM jsonb_each(coalesce(v_rec->'reads', '{}')) j
    LOOP
        IF v_link IS DISTINCT FROM coalesce((SELECT jsonb_build_array(l.seq, l.hash)
                FROM dpbudget_lanes l WHERE l.key = v_key), jsonb_build_array(0, repeat('0', 64)))
                OR (v_link->>0)::numeric >= NEW.seq THEN
            RAISE EXCEPTION 'dpbudget ledger: entry % refused: it read % at another record than '
                'its last, or at one numbered after it', NEW.seq, v_key
                USING ERRCODE = 'check_violation';
        END IF;
    END LOOP;
    -- A record numbered by the owner, not by the sequence (an import): later numbers follow it.
    IF NEW.seq > coalesce(pg_sequence_last_value('dpbudget_seq'), 0) THEN
        PERFORM setval('dpbudget_seq', NEW.seq);
    END IF;
    RETURN NULL;
END $$;

REVOKE ALL ON FUNCTION {S}.dpbudget_append_only(), {S}.dpbudget_entry_check(),
    {S}.dpbudget_account_check(), {S}.dpbudget_entry_lanes() FROM PUBLIC;

-- Every table is logged: an unlogged one loses its rows in a crash, and is not waited for.
ALTER TABLE {S}.dpbudget_meta SET LOGGED;
ALTER TABLE {S}.dpbudget_entries SET LOGGED;
ALTER TABLE {S}.dpbudget_accounts SET LOGGED;
ALTER TABLE {S}.dpbudget_lanes SET LOGGED;
ALTER TABLE {S}.dpbudget_salt SET LOGGED;
DO $logged$ BEGIN  -- (a sequence can be unlogged, and set logged, from PostgreSQL 15 on)
    IF current_setting('server_version_num')::int >= 150000 THEN
        EXECUTE 'ALTER SEQUENCE ' || {S_LITERAL} || '.dpbudget_seq SET LOGGED';
    END IF;
END $logged$;

{TRIGGERS}
INSERT INTO {S}.dpbudget_meta VALUES ('schema', '{V}')
    ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;
