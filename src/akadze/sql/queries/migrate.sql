-- Schema migrations (akadze.migrate): the bookkeeping around the migration files of
-- sql/migrations. Every migration runs in one transaction with these statements.

-- name: migrate_lock
-- One migrator at a time, cluster-wide: a second `akadze migrate` waits here until
-- the first commits, then finds nothing left to apply. Taken before the bootstrap,
-- so that two migrators of a fresh database do not race to create the table.
SELECT pg_advisory_xact_lock(%(key)s::bigint)

-- name: migrate_bootstrap
-- The table of applied versions, made before any migration (it is not part of one).
CREATE SCHEMA IF NOT EXISTS akadze;
CREATE TABLE IF NOT EXISTS akadze.migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: migrate_has_table
-- Whether the database was ever migrated (a check writes nothing, not even the table).
SELECT to_regclass('akadze.migrations') IS NOT NULL

-- name: migrate_applied
SELECT version FROM akadze.migrations

-- name: migrate_record
INSERT INTO akadze.migrations (version, name) VALUES (%(version)s, %(name)s)
