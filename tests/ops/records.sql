-- The ops layer's statements on records, for both parts (xtask/src/layers/ops.rs). Each
-- `-- [name]` line starts a statement the layer runs by name through psql, with psql variables
-- (`:'key'` a literal, `:rows` as is).

-- [create_extension]
CREATE EXTENSION idempotency;

-- [stuck_reserve] a reservation of :key with a 1 s lease, nobody to complete it
SELECT (idem_reserve('ops', 'u', :'key', 'h', lease => '1 second')).outcome;

-- [status_of]
SELECT _idem_status_word(status) FROM idem_records WHERE key = :'key';

-- [fill_expired] :rows finished records whose ttl has passed, in one transaction
INSERT INTO idem_records (id, operation, user_id, key, request_hash, status, token, response,
                          lease_expires_at, expires_at, created_at, updated_at, attempts)
  SELECT _idem_id('bulk', 'u', 'k' || i), 'bulk', 'u', 'k' || i, _idem_hash('h'),
         CASE WHEN i % 10 = 0 THEN 'f' ELSE 's' END::"char",
         nextval('idem_token_seq'), '{"status": 201}',
         now() - interval '2 days', now() - interval '1 day', now() - interval '2 days', now(), 0
    FROM generate_series(1, :rows) AS i;

-- [bulk_left]
SELECT count(*) FROM idem_records WHERE operation = 'bulk';

-- [txid]
SELECT txid_current();
