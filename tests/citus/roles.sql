-- The Citus layer's roles (xtask/src/layers/citus.rs, fn roles): a record belongs to the role
-- that reserved it (0.6.0), on a distributed idem_records too, where idem_complete and
-- idem_heartbeat check the owner before their update. Run by name (see nodes.sql).

-- [roles_create] two login roles of the application, created through the coordinator (Citus
-- creates them on the workers)
CREATE ROLE idem_alice LOGIN;
CREATE ROLE idem_bob LOGIN;
GRANT idempotency_user TO idem_alice, idem_bob;

-- [roles_reserve] as idem_alice, delegated
SELECT token FROM idem_reserve('roles', :'u1', 'k', 'h');

-- [roles_complete] delegated
SELECT idem_complete('roles', :'u1', 'k', :token, '{}');

-- [roles_heartbeat] delegated
SELECT idem_heartbeat('roles', :'u1', 'k', :token);
