-- The order of reads of an org's subscription, by the database rather than by instances'
-- clocks: a ticket (`stripe_seq`) is taken before each read, and a state is applied only
-- over one read with a lower ticket (`stripe_applied_seq`). Whole seconds of several
-- instances' clocks tied, and let an older read win.
ALTER TABLE orgs ADD COLUMN stripe_seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE orgs ADD COLUMN stripe_applied_seq BIGINT NOT NULL DEFAULT 0;
