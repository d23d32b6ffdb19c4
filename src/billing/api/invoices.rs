//! Invoice items (pay-as-you-go's charges) and invoices with all their lines.

use std::collections::HashMap;

use stripe_client_core::StripeRequest;

use super::client::currency_code;
use super::types::REQUEST;
use super::{Invoice, InvoiceItem, InvoiceLine, Readable, StripeApi, StripeResult};
use crate::billing::subscription::List;

impl StripeApi {
    /// The invoice item an earlier try of this request made.
    pub async fn invoice_item_by_request(
        &self,
        customer: &str,
        request: &str,
    ) -> StripeResult<Option<InvoiceItem>> {
        use stripe_billing::invoice_item::ListInvoiceItem;
        self.find_made(
            request,
            |_| true,
            |after| {
                let mut req = ListInvoiceItem::new().customer(customer).limit(100);
                if let Some(a) = after {
                    req = req.starting_after(a);
                }
                req.build()
            },
        )
        .await
    }

    /// An invoice item for pay-as-you-go: on `invoice` (a draft) when given, else pending
    /// on the customer for its subscription's next invoice. The metadata names the org and
    /// the window it charges, so that the invoice report finds it.
    #[allow(clippy::too_many_arguments)]
    pub async fn create_overage_item(
        &self,
        customer: &str,
        subscription: Option<&str>,
        invoice: Option<&str>,
        cents: i64,
        currency: &str,
        description: &str,
        mut metadata: HashMap<String, String>,
        request: &str,
        idempotency_key: &str,
    ) -> StripeResult<InvoiceItem> {
        metadata.insert(REQUEST.to_owned(), request.to_owned());
        let mut req = stripe_billing::invoice_item::CreateInvoiceItem::new()
            .customer(customer)
            .amount(cents)
            .currency(currency_code(currency))
            .description(description)
            .metadata(metadata);
        if let Some(s) = subscription {
            req = req.subscription(s);
        }
        if let Some(i) = invoice {
            req = req.invoice(i);
        }
        self.send(req.build(), Some(idempotency_key)).await
    }

    /// One page of a customer's invoices, newest first. An invoice's embedded lines are
    /// the first page of them (`all_lines` reads the rest).
    pub async fn invoices(
        &self,
        customer: &str,
        starting_after: Option<&str>,
    ) -> StripeResult<List<Readable<Invoice>>> {
        let mut req = stripe_billing::invoice::ListInvoice::new()
            .customer(customer)
            .limit(100);
        if let Some(after) = starting_after {
            req = req.starting_after(after);
        }
        self.send(req.build(), None).await
    }

    /// `inv` with every line, paging past the ones it came with while Stripe has more.
    pub async fn all_lines(&self, mut inv: Invoice) -> StripeResult<Invoice> {
        use stripe_billing::invoice_line_item::ListInvoiceInvoiceLineItem;
        let mut seen: std::collections::HashSet<String> =
            inv.lines.data.iter().filter_map(|l| l.id.clone()).collect();
        while inv.lines.has_more {
            let Some(after) = inv.lines.data.last().and_then(|l| l.id.clone()) else {
                break;
            };
            let req = ListInvoiceInvoiceLineItem::new(inv.id.as_str())
                .limit(100)
                .starting_after(after);
            let page: List<InvoiceLine> = self.send(req.build(), None).await?;
            let fresh: Vec<InvoiceLine> = page
                .data
                .into_iter()
                .filter(|l| l.id.as_ref().is_none_or(|id| seen.insert(id.clone())))
                .collect();
            if fresh.is_empty() {
                break;
            }
            inv.lines.data.extend(fresh);
            inv.lines.has_more = page.has_more;
        }
        Ok(inv)
    }
}
