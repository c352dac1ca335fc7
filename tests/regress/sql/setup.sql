-- Helpers for every later file, on any install (the extension, upgraded, or portable).

-- A reservation without its volatile columns, and an error catcher that prints SQLSTATE and
-- message (so golden files check the message names the argument).
CREATE FUNCTION res(op text, u text, k text, h text, ttl interval DEFAULT NULL,
                    lease interval DEFAULT NULL, wait boolean DEFAULT false)
    RETURNS TABLE (outcome text, has_token boolean, response jsonb, attempts integer)
    LANGUAGE sql AS $$
        SELECT r.outcome, r.token IS NOT NULL, r.response, r.attempts
          FROM idem_reserve(op, u, k, h, ttl, lease, wait) AS r $$;
CREATE FUNCTION err(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

