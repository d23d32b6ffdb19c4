-- A downgrade is made in Stripe when it is asked for (without proration, so the renewal
-- invoice is at the new price) and held here until the period ends. Schedules recorded by
-- an older release (made in Stripe only at the period's end) say false until reconcile
-- makes them in Stripe.
ALTER TABLE orgs ADD COLUMN scheduled_in_stripe BOOLEAN NOT NULL DEFAULT FALSE;
