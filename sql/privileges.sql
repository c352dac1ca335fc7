-- idempotency: privileges.
--
-- The API functions are SECURITY DEFINER (owned by the role that ran CREATE EXTENSION), so a role
-- needs only USAGE on the schema and EXECUTE on them. Nobody else reads or changes records.

REVOKE ALL ON TABLE @extschema@.idem_records, @extschema@.idem_retries FROM PUBLIC;
REVOKE ALL ON SEQUENCE @extschema@.idem_token_seq FROM PUBLIC;

-- Operators only: these read every user's records or act on many keys at once.
REVOKE EXECUTE ON FUNCTION
    @extschema@.idem_lookup(text, text, text),
    @extschema@.idem_stats(),
    @extschema@.idem_recover_stuck(integer, text, integer),
    @extschema@.idem_sweep(integer)
    FROM PUBLIC;

-- Internals run inside the API functions, as their owner.
REVOKE EXECUTE ON FUNCTION
    @extschema@._idem_setting(text),
    @extschema@._idem_conf(text),
    @extschema@._idem_check_part(text, text, boolean),
    @extschema@._idem_checked_interval(text, interval),
    @extschema@._idem_max_response_bytes(),
    @extschema@._idem_check_scope(text, text, text),
    @extschema@._idem_check_request_hash(text),
    @extschema@._idem_require(text, boolean),
    @extschema@._idem_check_batch_size(integer),
    @extschema@._idem_check_array(text, anyarray, text, integer, boolean),
    @extschema@._idem_echo(text),
    @extschema@._idem_require_writable(text),
    @extschema@._idem_ttl(interval),
    @extschema@._idem_lease(interval, interval),
    @extschema@._idem_max_retries(integer),
    @extschema@._idem_release_locked(text, text, text, timestamptz, timestamptz, integer),
    @extschema@._idem_write_nowait(text, text, text, text, bigint, timestamptz, timestamptz, timestamptz),
    @extschema@._idem_distributed()
    FROM PUBLIC;
