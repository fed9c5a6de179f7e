-- The restore guard: one row (docs/store.md, Backup and restore).
--   backup_taken_at  set only in a copy made by compass-server backup. While it
--                    is set the database is a backup not yet restored: serve
--                    and compass-callout refuse it, since tokens revoked after
--                    the backup would be live again. compass-server restore
--                    clears it once the later revocations are re-applied.
--   database_oid     PostgreSQL only (NULL here): the database the schema was
--                    stamped in.
--   restored_at      when compass-server restore last reconciled this database.
CREATE TABLE restore_guard (
    id              INTEGER PRIMARY KEY CHECK (id = 1),
    backup_taken_at TEXT,
    database_oid    INTEGER,
    restored_at     TEXT
);
INSERT INTO restore_guard (id) VALUES (1);
