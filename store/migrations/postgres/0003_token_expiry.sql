-- When a minted token stops resolving: created_at plus the TTL it was minted
-- with (compass-server mint-* --ttl). NULL: it never expires.
ALTER TABLE tokens ADD COLUMN expires_at TIMESTAMPTZ;
