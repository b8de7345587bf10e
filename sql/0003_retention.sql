-- Retention (seed 004 §6) finds finished runs by when they ended.
CREATE INDEX runs_ended ON runs (ended_at) WHERE ended_at IS NOT NULL;
