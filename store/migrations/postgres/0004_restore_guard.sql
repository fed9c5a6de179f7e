-- The restore guard: one row (docs/store.md, Backup and restore).
--   backup_taken_at  set only in an SQLite copy made by compass-server backup;
--                    NULL here (a PostgreSQL backup is a pg_dump).
--   database_oid     the database the schema was stamped in (pg_database.oid).
--                    pg_dump carries this row, so a dump restored into a new
--                    database holds another database's OID: serve and
--                    compass-callout refuse it until compass-server restore
--                    has re-applied the revocations made in the old database
--                    since the dump, and stamped the new OID.
--   restored_at      when compass-server restore last reconciled this database.
CREATE TABLE restore_guard (
    id              INTEGER PRIMARY KEY CHECK (id = 1),
    backup_taken_at TIMESTAMPTZ,
    database_oid    BIGINT,
    restored_at     TIMESTAMPTZ
);
INSERT INTO restore_guard (id, database_oid)
    SELECT 1, oid::bigint FROM pg_database WHERE datname = current_database();
