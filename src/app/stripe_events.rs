//! Stripe's events as they arrive and as admins tend their queue: each stored once, then
//! applied by the billing job (`billing::events`), which a new event wakes.

use rush_meter_core::time::Secs;

use super::{Outcome, Refusal, Services};
use crate::billing::events::{Arrival, EventState};
use crate::store::StripeEventRow;

impl Services {
    /// Keep a signed event: queued for the billing job, or quarantined when it cannot be
    /// processed as sent (`event.refused` says why). False: it was stored before.
    pub async fn receive_stripe_event(&self, event: &Arrival) -> Outcome<bool> {
        let now = self.clock.now();
        if let Some(why) = &event.refused {
            let stored = self
                .db
                .quarantine_stripe_event(
                    &event.id,
                    &event.kind,
                    event.created,
                    &event.payload,
                    why,
                    now,
                )
                .await?;
            if stored {
                tracing::error!(event = %event.id, %why, "a signed Stripe event could not be processed as sent: quarantined");
            }
            return Ok(stored);
        }
        let stored = self
            .db
            .insert_stripe_event(
                &event.id,
                &event.kind,
                event.created,
                event.api_version.as_deref(),
                &event.payload,
                now,
            )
            .await?;
        if stored {
            self.note_version(event);
            self.stripe_wake.notify_one();
        }
        Ok(stored)
    }

    /// Count and warn about an event rendered in another API version than the service
    /// sends: its objects may lack fields, or carry them elsewhere (the service reads both
    /// shapes it knows, but the endpoint should be moved to the service's version).
    fn note_version(&self, event: &Arrival) {
        let ours = crate::billing::api::stripe_version();
        let Some(theirs) = event.api_version.as_deref().filter(|v| *v != ours) else {
            return;
        };
        self.metrics
            .stripe_event_versions_other
            .get_or_create(&crate::metrics::VersionLabels {
                api_version: theirs.to_owned(),
            })
            .inc();
        tracing::warn!(event = %event.id, api_version = theirs, expected = ours, "Stripe event in another API version than the service speaks: set the webhook endpoint's version (docs/billing.md)");
    }

    /// A page of Stripe's events, newest first (`only` those in one state).
    pub async fn stripe_events(
        &self,
        only: Option<EventState>,
        after: Option<(Secs, String)>,
        limit: i64,
    ) -> Outcome<Vec<StripeEventRow>> {
        Ok(self
            .db
            .list_stripe_events(only.map(EventState::as_str), after, limit)
            .await?)
    }

    /// Put a quarantined event back in the queue and wake the job.
    pub async fn requeue_stripe_event(&self, event_id: &str) -> Outcome<()> {
        if !self
            .db
            .requeue_stripe_event(event_id, self.clock.now())
            .await?
        {
            return Err(Refusal::NotFound(format!(
                "no quarantined Stripe event `{event_id}`"
            )));
        }
        self.stripe_wake.notify_one();
        Ok(())
    }
}
