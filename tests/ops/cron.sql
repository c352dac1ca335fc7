-- The ops layer's pg_cron recipe, as docs/operations.md gives it (xtask/src/layers/ops.rs, fn
-- pg_cron). Run by name (see records.sql).

-- [cron_database]
CREATE DATABASE idem_cron;

-- [have_maintain]
SELECT count(*) FROM pg_proc WHERE proname = 'idem_maintain';

-- [cron_extension]
CREATE EXTENSION pg_cron;

-- [cron_schedule]
SELECT cron.schedule_in_database('idem-maintenance', '* * * * *', 'CALL public.idem_maintain()', 'idem_cron');

-- [cron_run_status] the first run's status
SELECT status FROM cron.job_run_details ORDER BY runid LIMIT 1;
