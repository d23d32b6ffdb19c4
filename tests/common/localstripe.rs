//! localstripe, the Stripe fake of the tests: one process per test on its own port, from
//! scratch. The first test that needs it installs it into `.venv/` (`super::venv`);
//! `LOCALSTRIPE` names another binary.

use std::time::Duration;

use serde_json::Value;

pub const KEY: &str = "sk_test_rush_meter";
/// The webhook signing secret the tests' servers take.
pub const WEBHOOK_SECRET: &str = "whsec_rush_meter_test";

/// Stripe on, at `base` (localstripe or a fake), with `KEY` and `WEBHOOK_SECRET`.
pub fn stripe_at(base: &str) -> rush_meter::config::StripeConfig {
    rush_meter::config::StripeConfig {
        secret_key: Some(secrecy::SecretString::from(KEY)),
        api_base: base.to_owned(),
        webhook_secrets: vec![secrecy::SecretString::from(WEBHOOK_SECRET)],
        ..rush_meter::config::StripeConfig::default()
    }
}

pub struct LocalStripe {
    pub url: String,
    http: reqwest::Client,
    _child: tokio::process::Child,
}

/// The version the tests are written against.
const VERSION: &str = "localstripe==1.15.10";

impl LocalStripe {
    /// `None` (with a note) when localstripe cannot be installed, except on CI, where that
    /// fails.
    pub async fn start() -> Option<LocalStripe> {
        let bin = match std::env::var_os("LOCALSTRIPE") {
            Some(b) => b.into(),
            None => tokio::task::block_in_place(|| super::venv::tool("localstripe", VERSION))?,
        };
        let (child, port) = Self::spawn(&bin).await;
        let url = format!("http://127.0.0.1:{port}");
        let ls = LocalStripe {
            url,
            http: reqwest::Client::new(),
            _child: child,
        };
        for (id, amount, name) in [
            ("pro_monthly", "2000", "Pro"),
            ("team_monthly", "20000", "Team"),
        ] {
            ls.post(
                "/v1/plans",
                &[
                    ("id", id),
                    ("amount", amount),
                    ("currency", "usd"),
                    ("interval", "month"),
                    ("product[name]", name),
                ],
            )
            .await;
        }
        Some(ls)
    }

    /// localstripe listening on a port of its own. It takes the port it is given, so the
    /// test picks a free one; another process may take that one first, and then localstripe
    /// exits: it is ours only once it says it runs (stdout, unbuffered), else try another.
    async fn spawn(bin: &std::path::Path) -> (tokio::process::Child, u16) {
        use tokio::io::AsyncBufReadExt;
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut child = tokio::process::Command::new(bin)
                .args(["--port", &port.to_string(), "--from-scratch"])
                .env("PYTHONUNBUFFERED", "1")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("localstripe starts");
            let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
            let running = async {
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.contains("Running on") {
                        return true;
                    }
                }
                false
            };
            match tokio::time::timeout(Duration::from_secs(20), running).await {
                Ok(true) => {
                    // Its access log goes to stderr (discarded), but whatever else it prints must never
                    // fill the pipe: keep reading.
                    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                    return (child, port);
                }
                Ok(false) => continue,
                Err(_) => panic!("localstripe did not start on {port} within 20 s"),
            }
        }
        panic!("localstripe found no free port in five tries")
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        form: &[(&str, &str)],
    ) -> (u16, Value) {
        let resp = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(KEY)
            .form(form)
            .send()
            .await
            .expect("localstripe answers");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn post(&self, path: &str, form: &[(&str, &str)]) -> Value {
        let (status, v) = self.call(reqwest::Method::POST, path, form).await;
        assert!(status < 300, "localstripe POST {path} -> {status}: {v}");
        v
    }

    /// Send webhooks to `url`, signed with `secret`.
    pub async fn register_webhook(&self, url: &str, secret: &str) {
        self.post(
            "/_config/webhooks/rush_meter",
            &[("url", url), ("secret", secret)],
        )
        .await;
    }

    /// A customer that can pay, optionally naming its org.
    pub async fn customer(&self, org: Option<&str>) -> String {
        let mut form = vec![("invoice_settings[default_payment_method]", "pm_card_visa")];
        if let Some(o) = org {
            form.push(("metadata[org_id]", o));
        }
        self.post("/v1/customers", &form).await["id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// A customer whose saved card (its invoices' default) is the test card `number`:
    /// `4000000000000341` is declined when charged, `4000002760003184` asks for the
    /// customer to authenticate.
    pub async fn customer_with_card(&self, org: &str, number: &str) -> String {
        let customer = self
            .post("/v1/customers", &[("metadata[org_id]", org)])
            .await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let pm = self
            .post(
                "/v1/payment_methods",
                &[
                    ("type", "card"),
                    ("card[number]", number),
                    ("card[exp_month]", "12"),
                    ("card[exp_year]", "2030"),
                    ("card[cvc]", "123"),
                ],
            )
            .await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        self.post(
            &format!("/v1/payment_methods/{pm}/attach"),
            &[("customer", &customer)],
        )
        .await;
        self.post(
            &format!("/v1/customers/{customer}"),
            &[("invoice_settings[default_payment_method]", &pm)],
        )
        .await;
        customer
    }

    /// The payment intents Stripe holds.
    pub async fn payment_intents(&self) -> Vec<serde_json::Value> {
        let (_, v) = self
            .call(reqwest::Method::GET, "/v1/payment_intents", &[])
            .await;
        v["data"].as_array().cloned().unwrap_or_default()
    }

    pub async fn subscribe(&self, customer: &str, plan: &str) -> String {
        self.post(
            "/v1/subscriptions",
            &[("customer", customer), ("items[0][plan]", plan)],
        )
        .await["id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The invoice items Stripe holds for `customer`.
    pub async fn invoice_items(&self, customer: &str) -> Vec<serde_json::Value> {
        let path = format!("/v1/invoiceitems?customer={customer}");
        let (_, v) = self.call(reqwest::Method::GET, &path, &[]).await;
        v["data"].as_array().cloned().unwrap_or_default()
    }

    pub async fn cancel(&self, subscription: &str) {
        let (status, v) = self
            .call(
                reqwest::Method::DELETE,
                &format!("/v1/subscriptions/{subscription}"),
                &[],
            )
            .await;
        assert_eq!(status, 200, "{v}");
    }
}
