-- The API version each webhook event was rendered in (its envelope's `api_version`), so
-- that an endpoint on another version than the service speaks shows in the events list.
ALTER TABLE stripe_events ADD COLUMN api_version TEXT;
