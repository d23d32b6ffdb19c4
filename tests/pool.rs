//! The store's pools: a caller cut off mid-way (a client gone, a timeout) leaves no
//! connection inside a transaction, so what the next caller writes on it is committed.

mod common;

use std::future::Future;
use std::task::Poll;

use common::{fresh_database, Backend};
use rush_meter::store::{Db, OrgUpsert, PoolSettings};
use rush_meter_core::audit::Actor;

/// Poll `fut` `polls` times, letting the runtime run in between, then drop it unless it
/// finished: a caller cut off after that much progress.
async fn cut_off_after<F: Future>(fut: F, polls: usize) {
    let mut fut = std::pin::pin!(fut);
    for _ in 0..polls {
        let done = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_ready())).await;
        if done {
            return;
        }
        tokio::task::yield_now().await;
    }
}

every_backend!(a_write_cut_off_while_it_begins_leaves_the_next_write_committed);

async fn a_write_cut_off_while_it_begins_leaves_the_next_write_committed(backend: Backend) {
    let Some((url, _dir)) = fresh_database(backend).await else {
        return;
    };
    // One connection, so that every caller gets the one the cut-off callers left.
    let one = PoolSettings {
        max_connections: 1,
        ..PoolSettings::default()
    };
    let db = Db::connect(&url, one).await.expect("connect");
    db.migrate().await.expect("migrate");
    let actor = Actor::system("test");
    let other = Db::connect(&url, PoolSettings::default())
        .await
        .expect("connect");
    // Cut off after 1, 2, 3… polls: one of them lands while BEGIN is on its way, the
    // moment sqlx 0.8.6 loses track of the transaction (transact-rs/sqlx#4393).
    for polls in 1..=40 {
        let org = OrgUpsert {
            org_id: format!("org{polls}"),
            plan_id: Some("pro".into()),
            plan_version: None,
            ..OrgUpsert::default()
        };
        cut_off_after(db.upsert_org(&org, 1_000, &actor), polls).await;
        // A write outside any transaction (a Stripe event, acknowledged to Stripe once
        // it returns), on the pool's one connection...
        let event = format!("evt_after_{polls}_polls");
        let stored = db
            .insert_stripe_event(&event, "customer.updated", 1_000, None, "{}", 1_000)
            .await
            .expect("stored");
        assert!(stored);
        // ...is committed: a connection of another pool sees it.
        let events = other
            .list_stripe_events(None, None, 100)
            .await
            .expect("events");
        assert!(
            events.iter().any(|e| e.event_id == event),
            "the event written after a caller cut off at {polls} polls is not committed"
        );
    }
}
