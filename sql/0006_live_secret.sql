-- The secret behind the live channel (src/live/mod.rs). PostgreSQL has no privileges on
-- LISTEN and NOTIFY: any login of the database can listen on a channel it can name, and
-- notify on it. So the channel's name is derived from this secret, which only the owner
-- can read, and its payloads carry only tokens keyed by it: another login can neither
-- find the channel nor learn a tenant, run or seq from it, nor forge a wake-up. 256
-- random bits from gen_random_uuid (PostgreSQL's strong random source).
CREATE TABLE live_secret (
    only_row  boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    secret    text NOT NULL CHECK (length(secret) >= 64)
);
REVOKE ALL ON live_secret FROM PUBLIC;
INSERT INTO live_secret (secret)
VALUES (replace(gen_random_uuid()::text || gen_random_uuid()::text || gen_random_uuid()::text, '-', ''));
