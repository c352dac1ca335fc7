-- idem_sweep: deletes expired finished records and unneeded expired counters, in batches.
\set VERBOSITY sqlstate

-- Ten finished records that expire at once, one that stays, one PROCESSING past its ttl.
SELECT count(idem_complete('sw', 'u', 'k' || i, (idem_reserve('sw', 'u', 'k' || i, 'h', ttl => '10 ms')).token, '{}'))
  FROM generate_series(1, 10) AS i;
SELECT idem_complete('sw', 'u', 'keep', (idem_reserve('sw', 'u', 'keep', 'h')).token, '{}');
SELECT (idem_reserve('sw', 'u', 'processing', 'h', ttl => '10 ms')).outcome;
SELECT pg_sleep(0.05);
SELECT expired FROM idem_stats();
SELECT idem_sweep(batch_size => 4);
SELECT idem_sweep(batch_size => 4);
SELECT idem_sweep();
SELECT idem_sweep();
SELECT key, status FROM idem_records WHERE operation = 'sw' ORDER BY key;

-- An expired key is free again, even before a sweep.
SELECT idem_complete('sw', 'u', 'again', (idem_reserve('sw', 'u', 'again', 'h', ttl => '10 ms')).token, '{"v": 1}');
SELECT pg_sleep(0.05);
SELECT * FROM res('sw', 'u', 'again', 'h');

-- Retry counters: swept once expired and no remaining record was created while they lived.
INSERT INTO idem_retries VALUES ('sw', 'u', 'orphan', 2, now() - interval '1 minute'),
                                ('sw', 'u', 'live', 2, now() + interval '1 hour'),
                                ('sw', 'u', 'keep', 2, now() - interval '1 minute');
UPDATE idem_records SET created_at = now() - interval '1 day' WHERE key = 'keep';
SELECT idem_sweep();
SELECT key, attempts FROM idem_retries ORDER BY key;

-- Errors.
SELECT err($$SELECT idem_sweep(0)$$);
SELECT err($$SELECT idem_sweep(NULL)$$);
DELETE FROM idem_records;
DELETE FROM idem_retries;
