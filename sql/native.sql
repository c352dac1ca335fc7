-- idempotency: the native hot path (extension/src/native). Replaces the PL/pgSQL
-- idem_reserve, idem_complete, idem_release and idem_heartbeat of reserve.sql and finish.sql
-- with C-language functions of the same signatures, defaults, attributes and comments; the
-- portable (pure SQL) install leaves this file out and keeps the PL/pgSQL versions.
--
-- Same semantics, less machinery: the argument rules checked once in Rust, a replay answered
-- by one direct probe of idem_records_pkey (no executor), the writes run as SPI plans kept per
-- backend. They keep SECURITY DEFINER (the writes run as the extension's owner) but pin no
-- search_path: they resolve nothing by name at call time (relations, the row type and the
-- sequence by OID, looked up in their own schema once per backend; the SPI statements qualify
-- every relation with the schema and every operator with pg_catalog; builtins called directly),
-- so a SET clause would only cost its GUC save and restore on every call - measured: a replay
-- at 0.80x a primary-key SELECT with it, 0.90x without, 8 clients (bench/ab.sh, 6 x 5 s).
-- pgspot's PS003 is expected for exactly these functions (scripts/test.sh), and the regress
-- file search_path hijacks a caller's path.

CREATE OR REPLACE FUNCTION @extschema@.idem_reserve(
    operation    text,
    user_id      text,
    key          text,
    request_hash text,
    ttl          interval DEFAULT NULL,
    lease        interval DEFAULT NULL,
    wait         boolean  DEFAULT false)
    RETURNS @extschema@.idem_reservation
    LANGUAGE c VOLATILE SECURITY DEFINER
    AS 'MODULE_PATHNAME', 'idem_reserve_native';

CREATE OR REPLACE FUNCTION @extschema@.idem_complete(
    operation text,
    user_id   text,
    key       text,
    token     bigint,
    response  jsonb,
    status    text DEFAULT 'SUCCESS')
    RETURNS boolean
    LANGUAGE c VOLATILE SECURITY DEFINER
    AS 'MODULE_PATHNAME', 'idem_complete_native';

CREATE OR REPLACE FUNCTION @extschema@.idem_release(
    operation   text,
    user_id     text,
    key         text,
    token       bigint,
    max_retries integer DEFAULT NULL)
    RETURNS text
    LANGUAGE c VOLATILE SECURITY DEFINER
    AS 'MODULE_PATHNAME', 'idem_release_native';

CREATE OR REPLACE FUNCTION @extschema@.idem_heartbeat(
    operation text,
    user_id   text,
    key       text,
    token     bigint,
    lease     interval DEFAULT NULL)
    RETURNS boolean
    LANGUAGE c VOLATILE SECURITY DEFINER
    AS 'MODULE_PATHNAME', 'idem_heartbeat_native';
