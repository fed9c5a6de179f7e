-- What a Runner reported of itself at its latest enrollment: its build version
-- and its host's name. Informational: neither is authenticated.
ALTER TABLE runners ADD COLUMN version TEXT NOT NULL DEFAULT '';
ALTER TABLE runners ADD COLUMN hostname TEXT NOT NULL DEFAULT '';
