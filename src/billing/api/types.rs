//! What Stripe answers, read leniently: only the fields used are required, so objects of
//! any API version (and of the local fake) read alike. Subscriptions and customers are
//! read by `billing::subscription`.

use std::collections::HashMap;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::billing::subscription::{Customer, List};

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct CheckoutSession {
    pub id: String,
    pub url: Option<String>,
    /// `open`, `complete` or `expired` (absent from the local fake's answers).
    pub status: Option<String>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct InvoiceItem {
    pub id: String,
    pub invoice: Option<String>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
}

/// An object this service creates in Stripe, named by the request that made it
/// (`metadata.rush_meter_request`), so that a try whose answer was lost finds it.
pub trait Made {
    fn id(&self) -> &str;
    fn metadata(&self) -> &HashMap<String, String>;
    fn made_by(&self, request: &str) -> bool {
        self.metadata().get(REQUEST).map(String::as_str) == Some(request)
    }
}

/// The metadata key that names the request an object was made by.
pub(super) const REQUEST: &str = "rush_meter_request";

macro_rules! made {
    ($($t:ty),*) => {$(
        impl Made for $t {
            fn id(&self) -> &str {
                &self.id
            }
            fn metadata(&self) -> &HashMap<String, String> {
                &self.metadata
            }
        }
    )*};
}
made!(CheckoutSession, InvoiceItem, Customer);

/// An element of a list, read on its own: one that does not parse is kept as its id and
/// the reason, so that one odd object does not stop a run over all of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readable<T> {
    Read(T),
    Unreadable { id: String, error: String },
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Readable<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        let id = v
            .get("id")
            .and_then(|i| i.as_str())
            .unwrap_or("(no id)")
            .to_owned();
        Ok(match serde_json::from_value(v) {
            Ok(t) => Readable::Read(t),
            Err(e) => Readable::Unreadable {
                id,
                error: e.to_string(),
            },
        })
    }
}

impl<T> Readable<T> {
    /// The id to page on, whether or not the element was read.
    pub fn id<'a>(&'a self, id_of: impl Fn(&'a T) -> &'a str) -> &'a str {
        match self {
            Readable::Read(t) => id_of(t),
            Readable::Unreadable { id, .. } => id,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct PortalSession {
    pub url: String,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Invoice {
    pub id: String,
    pub status: Option<String>,
    #[serde(default = "List::default")]
    pub lines: List<InvoiceLine>,
}

/// A line of an invoice: what it charges (cents; credits negative) for which service
/// period. A renewal invoice's own `period_start` is the period before; its lines say
/// what they are for.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct InvoiceLine {
    /// `il_…`: where the next page of lines starts.
    pub id: Option<String>,
    #[serde(default)]
    pub amount: i64,
    pub period: Option<LinePeriod>,
    /// An invoice item's metadata, carried onto its line: pay-as-you-go's names its window.
    #[serde(default)]
    pub metadata: HashMap<String, String>,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub struct LinePeriod {
    pub start: i64,
    pub end: i64,
}
