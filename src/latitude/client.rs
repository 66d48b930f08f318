//! The Latitude.sh client: typed calls, each attempt through a slot, the
//! pacer of its budget (reads or writes), and a per-attempt timeout.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use reqwest::header::{HeaderMap, HeaderValue};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

pub use super::error::LatitudeError;
use super::model::*;
use crate::metal::discipline::{ClientMetrics, Counted};
use crate::provider::discipline::{LocalPacer, Pacer, RetrySettings};
use crate::secret::ApiToken;

mod servers;

pub const BASE_URL_DEFAULT: &str = "https://api.latitude.sh";
/// The size the official tools use; the API documents no maximum.
pub const PAGE_SIZE_DEFAULT: u32 = 100;
/// The currency prices are read in where a plan gives several: the API
/// does not say which one the account is billed in.
pub const PREFERRED_CURRENCY: &str = "USD";
const MAX_PAGES: u32 = 10_000;
/// Readings of a listing that keeps changing under its reader before the
/// listing is given up as unreadable.
const LISTING_READS: u32 = 3;
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct LatitudeConfig {
    pub base_url: String,
    /// The project's id or slug.
    pub project: String,
    pub token: ApiToken,
    pub parallelism: usize,
    pub attempt_timeout: Duration,
    pub page_size: u32,
    pub retry: RetrySettings,
    /// `http://` to another machine is allowed (a fake elsewhere).
    pub allow_plain_http: bool,
    /// Where its calls are counted (`shepherd_provider_*{provider="latitude"}`).
    pub metrics: ClientMetrics,
}

impl LatitudeConfig {
    pub fn new(base_url: impl Into<String>, project: impl Into<String>, token: ApiToken) -> Self {
        LatitudeConfig {
            base_url: base_url.into(),
            project: project.into(),
            token,
            parallelism: 3,
            attempt_timeout: Duration::from_secs(30),
            page_size: PAGE_SIZE_DEFAULT,
            retry: RetrySettings::default(),
            allow_plain_http: false,
            metrics: ClientMetrics::for_provider(super::provider::NAME),
        }
    }
}

/// The calls a key may start per window: Latitude documents 60 reads and
/// 20 writes per minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    pub reads: u32,
    pub writes: u32,
    pub per: Duration,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            reads: 60,
            writes: 20,
            per: Duration::from_secs(60),
        }
    }
}

/// What a create asks for. The hostname is the witness: unique per
/// creation, so that a lookup by it finds this creation's server and no
/// other.
#[derive(Debug, Clone)]
pub struct CreateServer {
    pub plan: String,
    pub site: String,
    pub operating_system: String,
    pub hostname: String,
    pub ssh_keys: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Created {
    pub server: Server,
    /// Found by its hostname after an attempt whose outcome was not seen,
    /// not returned by the create.
    pub recovered: bool,
    pub attempts: u32,
}

#[derive(Clone)]
pub struct LatitudeClient {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    base_url: String,
    project: String,
    page_size: u32,
    attempt_timeout: Duration,
    retry: RetrySettings,
    slots: Semaphore,
    reads: Arc<dyn Pacer>,
    writes: Arc<dyn Pacer>,
    metrics: ClientMetrics,
}

impl std::fmt::Debug for LatitudeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatitudeClient")
            .field("base_url", &self.inner.base_url)
            .field("project", &self.inner.project)
            .finish_non_exhaustive()
    }
}

/// Which of the project's servers a listing asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Servers<'a> {
    All,
    /// The one with this exact hostname (`filter[hostname]`).
    Hostname(&'a str),
    /// Those whose hostname starts so (`filter[hostname][prefix]`): a
    /// cluster's own servers, at a cost that does not grow with the rest
    /// of the project.
    HostnamePrefix(&'a str),
}

impl Servers<'_> {
    fn selects(&self, hostname: Option<&str>) -> bool {
        match self {
            Servers::All => true,
            Servers::Hostname(h) => hostname == Some(*h),
            Servers::HostnamePrefix(p) => hostname.is_some_and(|h| h.starts_with(*p)),
        }
    }
}

/// What one listing cost and found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListingReport {
    /// Pages read, re-readings included.
    pub pages: u32,
    /// Servers the pages held.
    pub read: u64,
    /// Servers the filter selects, as checked here.
    pub kept: u64,
    /// The pages held servers the filter should have left out: the API
    /// did not apply it.
    pub filter_ignored: bool,
}

/// One reading of a listing.
struct Once {
    servers: Vec<Server>,
    read: u64,
    total: Option<u64>,
    pages: u32,
    filter_ignored: bool,
}

/// One exchange's answer: status and body.
struct Answer {
    status: u16,
    body: Vec<u8>,
}

impl LatitudeClient {
    /// A client with Latitude's budgets within this process only (a
    /// command, a test; workers use [`LatitudeClient::for_cluster`]). Each
    /// budget is a bucket of half the limit that refills half the limit a
    /// minute: a full bucket and its refill stay within the limit in any
    /// minute, where a bucket of the whole limit could start twice that.
    pub fn new(config: LatitudeConfig) -> Result<Self, LatitudeError> {
        let minute = Duration::from_secs(60);
        let budgets = Budgets::default();
        let reads = Arc::new(LocalPacer::new(crate::config::Rate {
            interval: minute,
            burst: budgets.reads / 2,
        }));
        let writes = Arc::new(LocalPacer::new(crate::config::Rate {
            interval: minute,
            burst: budgets.writes / 2,
        }));
        Self::with_pacers(config, reads, writes)
    }

    /// A client whose reads and writes share the cluster's budgets, kept
    /// in Postgres: Latitude counts calls per key, whichever process makes
    /// them. At most `budgets.reads` reads and `budgets.writes` writes start
    /// in any window of `budgets.per`, and a 429 holds every process.
    pub fn for_cluster(
        config: LatitudeConfig,
        pool: sqlx::PgPool,
        budgets: Budgets,
    ) -> Result<Self, LatitudeError> {
        use crate::limiter::{LATITUDE_READS, LATITUDE_WRITES, WindowLimiter};
        let reads = WindowLimiter::new(pool.clone(), LATITUDE_READS, budgets.reads, budgets.per);
        let writes = WindowLimiter::new(pool, LATITUDE_WRITES, budgets.writes, budgets.per);
        Self::with_pacers(config, Arc::new(reads), Arc::new(writes))
    }

    /// A client whose reads and writes are paced by the given pacers (e.g.
    /// ones shared by every process of a cluster).
    pub fn with_pacers(
        config: LatitudeConfig,
        reads: Arc<dyn Pacer>,
        writes: Arc<dyn Pacer>,
    ) -> Result<Self, LatitudeError> {
        let refused = |detail: &str| LatitudeError::Refused {
            call: "client",
            status: 0,
            code: None,
            detail: detail.into(),
        };
        if config.token.is_empty() {
            return Err(refused("the API key is empty"));
        }
        let mut key = HeaderValue::from_str(config.token.expose())
            .map_err(|_| refused("the API key is not a valid header value"))?;
        key.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, key);
        headers.insert(
            reqwest::header::ACCEPT,
            HeaderValue::from_static("application/vnd.api+json"),
        );
        // A redirect is never followed: the key would go wherever it points.
        let http = reqwest::Client::builder()
            .user_agent(concat!("shepherd/", env!("CARGO_PKG_VERSION")))
            .default_headers(headers)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| refused(&format!("cannot build the HTTP client: {e}")))?;
        let base_url = config.base_url.trim_end_matches('/').to_string();
        crate::provider::discipline::credential_url_allowed(&base_url, config.allow_plain_http)
            .map_err(|why| refused(&why))?;
        Ok(LatitudeClient {
            inner: Arc::new(Inner {
                http,
                base_url,
                project: config.project,
                page_size: config.page_size.max(1),
                attempt_timeout: config.attempt_timeout,
                retry: config.retry,
                slots: Semaphore::new(config.parallelism.max(1)),
                reads,
                writes,
                metrics: config.metrics,
            }),
        })
    }

    pub fn project(&self) -> &str {
        &self.inner.project
    }

    /// Where this client's calls are counted.
    pub fn metrics(&self) -> &ClientMetrics {
        &self.inner.metrics
    }

    // ----- one attempt -----

    async fn attempt(
        &self,
        call: &'static str,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Answer, LatitudeError> {
        self.attempt_fenced(call, method, path, query, body, || async { Ok(()) })
            .await
    }

    /// One attempt, asking `fence` once its turn and slot have come, right
    /// before the request leaves (`NotSent` if it refuses): the wait for a
    /// write slot can be as long as the budget's window, and what the
    /// fence guards may be lost during it.
    async fn attempt_fenced<F, Fut>(
        &self,
        call: &'static str,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
        fence: F,
    ) -> Result<Answer, LatitudeError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let read = method == Method::GET;
        let pacer = if read {
            &self.inner.reads
        } else {
            &self.inner.writes
        };
        let metrics = &self.inner.metrics;
        let waiting = Counted::new(&metrics.waiting);
        pacer
            .wait_turn()
            .await
            .map_err(|reason| LatitudeError::Transient { call, reason })?;
        let _slot = self
            .inner
            .slots
            .acquire()
            .await
            .expect("the semaphore is never closed");
        drop(waiting);
        fence()
            .await
            .map_err(|reason| LatitudeError::NotSent { call, reason })?;
        let talking = Counted::new(&metrics.in_flight);
        let started = std::time::Instant::now();
        let mut request = self
            .inner
            .http
            .request(method, format!("{}{path}", self.inner.base_url));
        if !query.is_empty() {
            request = request.query(query);
        }
        if let Some(b) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(b.to_string());
        }
        let exchange = async {
            let response = request.send().await?;
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            if response
                .content_length()
                .is_some_and(|n| n > MAX_BODY_BYTES as u64)
            {
                return Ok::<_, reqwest::Error>((status, headers, None));
            }
            // Read in chunks and stopped at the cap: an answer without a
            // length may be any size.
            let mut response = response;
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await? {
                if body.len() + chunk.len() > MAX_BODY_BYTES {
                    return Ok((status, headers, None));
                }
                body.extend_from_slice(&chunk);
            }
            Ok((status, headers, Some(body)))
        };
        let answered = tokio::time::timeout(self.inner.attempt_timeout, exchange).await;
        drop(talking);
        let answer = match &answered {
            Err(_) => "timeout".into(),
            Ok(Err(_)) => "error".into(),
            Ok(Ok((status, _, _))) => status.to_string(),
        };
        metrics.observe(call, answer, started.elapsed().as_secs_f64());
        let (status, headers, body) = match answered {
            Err(_) => {
                return Err(LatitudeError::Transient {
                    call,
                    reason: format!("no complete answer within {:?}", self.inner.attempt_timeout),
                });
            }
            // A connection that never opened carried nothing: the one
            // transport failure that proves a write was not done.
            Ok(Err(e)) if e.is_connect() => {
                return Err(LatitudeError::ConnectFailed {
                    call,
                    reason: crate::provider::discipline::describe_transport_error(&e),
                });
            }
            Ok(Err(e)) => {
                return Err(LatitudeError::Transient {
                    call,
                    reason: crate::provider::discipline::describe_transport_error(&e),
                });
            }
            Ok(Ok(v)) => v,
        };
        let Some(body) = body.filter(|b| b.len() <= MAX_BODY_BYTES) else {
            return Err(LatitudeError::Undecodable {
                call,
                status,
                detail: format!("answer larger than {MAX_BODY_BYTES} bytes"),
            });
        };
        if (200..300).contains(&status) {
            return Ok(Answer { status, body });
        }
        let error = serde_json::from_slice::<ErrorBody>(&body)
            .ok()
            .and_then(|b| b.errors.into_iter().next())
            .unwrap_or_default();
        let detail = error
            .text()
            .map(|t| crate::text::bounded(t, crate::text::MAX_MESSAGE))
            .unwrap_or_else(|| format!("HTTP {status}"));
        Err(match (status, error.code().as_deref()) {
            (429, _) => {
                let asked = header_seconds(&headers)
                    .or(error.meta.and_then(|m| m.retry_after))
                    .and_then(crate::provider::discipline::provider_wait)
                    .map(|w| w.min(MAX_WAIT));
                // Every caller of this budget waits, not only this one.
                let wait = asked.unwrap_or(Duration::from_secs(1));
                metrics.throttled.inc();
                metrics.held_until.set(
                    (std::time::SystemTime::now() + wait)
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64()),
                );
                if let Err(e) = pacer.hold(wait).await {
                    tracing::warn!(error = %e, "could not share the hold");
                }
                tracing::warn!(
                    call,
                    wait_ms = wait.as_millis() as u64,
                    "Latitude asked to slow down"
                );
                LatitudeError::RateLimited {
                    call,
                    retry_after: asked,
                }
            }
            (404, _) => LatitudeError::NotFound { call },
            (401 | 403, _) => LatitudeError::Unauthorized { call, status },
            (422, code) if out_of_stock(code, &detail) => {
                LatitudeError::OutOfStock { call, detail }
            }
            (s, _) if s >= 500 => LatitudeError::Transient {
                call,
                reason: format!("{s}: {detail}"),
            },
            (s, code) => LatitudeError::Refused {
                call,
                status: s,
                code: code.map(str::to_string),
                detail,
            },
        })
    }

    /// A call that converges when repeated, with retries.
    async fn read<T: DeserializeOwned>(
        &self,
        call: &'static str,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<T, LatitudeError> {
        self.retried(call, || async {
            let a = self.attempt(call, Method::GET, path, query, None).await?;
            decode(call, &a)
        })
        .await
    }

    async fn retried<T, F, Fut>(&self, call: &'static str, mut f: F) -> Result<T, LatitudeError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, LatitudeError>>,
    {
        let mut backoff = self.inner.retry.backoff();
        loop {
            let err = match f().await {
                Ok(v) => return Ok(v),
                Err(e) if e.is_retryable() => e,
                Err(e) => return Err(e),
            };
            let Some(wait) = next_wait(&mut backoff, &err) else {
                return Err(err);
            };
            tracing::info!(call, wait_ms = wait.as_millis() as u64, error = %err, "retrying");
            tokio::time::sleep(wait).await;
        }
    }

    // ----- stock, keys, deletes -----

    /// How much of `plan` `site` has now, from `GET /plans`.
    pub async fn stock(&self, plan: &str, site: &str) -> Result<Stock, LatitudeError> {
        Ok(self.offer(plan, site).await?.0)
    }

    /// The plan's stock at the site and one server's price there, from one
    /// read of the plan (the price in USD where the answer has it).
    pub async fn offer(
        &self,
        plan: &str,
        site: &str,
    ) -> Result<(Stock, Option<Price>), LatitudeError> {
        let plans: Envelope<Vec<Plan>> = self
            .read("get-plans", "/plans", &[("filter[slug]", plan.to_string())])
            .await?;
        Ok(plans
            .data
            .iter()
            .find(|p| p.attributes.slug.as_deref() == Some(plan))
            .map_or((Stock::Unavailable, None), |p| {
                (p.stock(site), p.price(site, PREFERRED_CURRENCY))
            }))
    }

    /// The id of the project's key with this public key, created under
    /// `name` if there is none.
    pub async fn ensure_ssh_key(
        &self,
        name: &str,
        public_key: &str,
    ) -> Result<String, LatitudeError> {
        let call = "get-ssh-keys";
        let wanted = public_key.trim();
        let mut found = None;
        for number in 1..=MAX_PAGES {
            let page: Page<SshKey> = self
                .read(
                    call,
                    "/ssh_keys",
                    &[
                        ("filter[project]", self.inner.project.clone()),
                        ("page[size]", self.inner.page_size.to_string()),
                        ("page[number]", number.to_string()),
                    ],
                )
                .await?;
            let short = page.data.len() < self.inner.page_size as usize;
            // The same key whatever its comment: its type and body.
            found = page.data.into_iter().find(|k| {
                k.attributes
                    .public_key
                    .as_deref()
                    .is_some_and(|have| same_key(have, wanted))
            });
            if found.is_some() || short {
                break;
            }
        }
        if let Some(k) = found {
            return Ok(k.id);
        }
        let call = "post-ssh-key";
        let body = json!({"data": {"type": "ssh_keys", "attributes": {
            "name": name, "public_key": wanted, "project": self.inner.project}}});
        // A key created twice is harmless (two entries, either works), so a
        // lost answer is retried like a read.
        let created: Envelope<SshKey> = self
            .retried(call, || async {
                let a = self
                    .attempt(call, Method::POST, "/ssh_keys", &[], Some(&body))
                    .await?;
                decode(call, &a)
            })
            .await?;
        Ok(created.data.id)
    }
}

/// Whether a 422 says the plan is out of stock in the site: the code the
/// API documents, or (answers were seen without it) its words.
fn out_of_stock(code: Option<&str>, detail: &str) -> bool {
    if code.is_some_and(|c| c.eq_ignore_ascii_case("SERVERS_OUT_OF_STOCK")) {
        return true;
    }
    let detail = detail.to_ascii_lowercase();
    ["out of stock", "no stock", "stock availability"]
        .iter()
        .any(|words| detail.contains(words))
}

fn decode<T: DeserializeOwned>(call: &'static str, a: &Answer) -> Result<T, LatitudeError> {
    serde_json::from_slice(&a.body).map_err(|e| LatitudeError::Undecodable {
        call,
        status: a.status,
        detail: e.to_string(),
    })
}

/// Two OpenSSH public keys are the same key when their type and body are,
/// whatever their comments.
fn same_key(a: &str, b: &str) -> bool {
    fn key(k: &str) -> Vec<&str> {
        k.split_whitespace().take(2).collect()
    }
    let (a, b) = (key(a), key(b));
    a.len() == 2 && a == b
}

/// The longest Latitude may hold the cluster on one 429: its budgets are
/// counted per minute, so a wait past two of its windows is no wait of its
/// budget's but a bug or an attack (one `Retry-After: 1e300` held every
/// worker for the 15 minutes all providers are allowed).
pub const MAX_WAIT: Duration = Duration::from_secs(120);

/// `id` if it has the shape of the API's ids, so that it may enter a path
/// (`../`, `?` or `/` would change which resource a request names).
fn checked_id<'a>(call: &'static str, id: &'a str) -> Result<&'a str, LatitudeError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(id)
    } else {
        Err(LatitudeError::BadId {
            call,
            id: crate::text::bounded(id, 80),
        })
    }
}

/// A `Retry-After` header in seconds, should the API ever send one.
fn header_seconds(headers: &HeaderMap) -> Option<f64> {
    headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The wait before the next try: the backoff's, or as long as a 429 asked
/// if that is longer; `None` when the retry budget is spent, or would be
/// by the wait (the call ends rate limited at once, and the hold it
/// recorded paces every later call: no caller sleeps past its budget).
fn next_wait(backoff: &mut backoff::ExponentialBackoff, err: &LatitudeError) -> Option<Duration> {
    use backoff::backoff::Backoff;
    let wait = backoff.next_backoff()?;
    let LatitudeError::RateLimited {
        retry_after: Some(asked),
        ..
    } = err
    else {
        return Some(wait);
    };
    let left = backoff
        .max_elapsed_time
        .map(|max| max.saturating_sub(backoff.get_elapsed_time()));
    if left.is_some_and(|left| *asked > left) {
        return None;
    }
    Some(wait.max(*asked))
}
