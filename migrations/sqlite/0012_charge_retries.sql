-- A pay-as-you-go charge Stripe refused (or could not be reached for) is tried again with
-- backoff, and after its tries marked `failed` for an admin, instead of every few seconds
-- without end.
ALTER TABLE overage_charges ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE overage_charges ADD COLUMN next_attempt_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE overage_charges ADD COLUMN last_error TEXT;
CREATE INDEX overage_charges_due ON overage_charges (next_attempt_at) WHERE state = 'pending';
