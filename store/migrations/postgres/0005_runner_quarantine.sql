-- Duplicates and quarantine (docs/designs/DECISIONS.md, DL-459): one row per
-- Runner ID that compass-callout displaced (kicked an older live connection
-- of as a duplicate). compass-callout writes it, as a role granted INSERT and
-- UPDATE on this table alone (docs/store.md); compass-server clear-quarantine
-- deletes a row.
--   window_start       the first displacement of the current window
--   displacements      displacements since window_start
--   last_displaced_at  the latest displacement
--   newer_client       host:port of the connection that displaced the older one
--   older_client       host:port of the connection it ended
--   quarantined_at     set once displacements passed the callout's threshold
--                      within the window: every connection of the ID is ended,
--                      new ones and Enroll refused, until cleared
CREATE TABLE runner_quarantine (
    runner_id         TEXT PRIMARY KEY,
    window_start      TIMESTAMPTZ NOT NULL,
    displacements     INTEGER NOT NULL CHECK (displacements >= 0),
    last_displaced_at TIMESTAMPTZ NOT NULL,
    newer_client      TEXT NOT NULL DEFAULT '',
    older_client      TEXT NOT NULL DEFAULT '',
    quarantined_at    TIMESTAMPTZ
);
