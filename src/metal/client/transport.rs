//! One HTTP exchange: the gate, the attempt's timeout, reading a bounded
//! body, and turning statuses and bodies into answers or typed errors.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde::de::DeserializeOwned;

use super::*;

impl MetalClient {
    /// One call with retries, decoded as JSON.
    pub(super) async fn json<T: DeserializeOwned>(&self, call: Call<'_>) -> Result<T, MetalError> {
        retry(&self.inner.retry, call.op.id(), |_| {
            self.json_once(call.clone_ref())
        })
        .await
    }

    /// One attempt, decoded as JSON.
    pub(super) async fn json_once<T: DeserializeOwned>(
        &self,
        call: Call<'_>,
    ) -> Result<T, MetalError> {
        let (status, body) = self.attempt(&call).await?;
        decode(call.op, status, &body)
    }

    /// One attempt through the gate, with its own timeout. Returns the status
    /// and body of a success; any other answer becomes an error.
    pub(super) async fn attempt(&self, call: &Call<'_>) -> Result<(u16, Vec<u8>), MetalError> {
        self.attempt_paced(call, None, None).await
    }

    /// One attempt; `pacer`, when given (the creation limiter), is awaited
    /// before the attempt asks the gate for a slot and an API turn: a
    /// creation waiting for its turn holds none of the process's API slots,
    /// so listings and assimilations do not queue behind it. A turn that
    /// went stale while the gate held the call up (every slot busy) is given
    /// up and another taken, so starts on the wire keep the pacer's spacing.
    pub(super) async fn attempt_paced(
        &self,
        call: &Call<'_>,
        pacer: Option<&dyn Pacer>,
        fence: Option<&dyn Fence>,
    ) -> Result<(u16, Vec<u8>), MetalError> {
        let admission = match pacer {
            None => self.inner.gate.admit(call.op).await?,
            Some(pacer) => loop {
                pacer
                    .wait_turn()
                    .await
                    .map_err(|reason| MetalError::Transient {
                        op: call.op,
                        reason,
                    })?;
                let turn = tokio::time::Instant::now();
                let admission = self.inner.gate.admit(call.op).await?;
                if turn.elapsed() <= pacer.slack() {
                    break admission;
                }
                tracing::debug!(
                    op = call.op.id(),
                    late_ms = turn.elapsed().as_millis() as u64,
                    "turn went stale waiting for an API slot; taking another"
                );
            },
        };
        if let Some(fence) = fence {
            fence.check().await.map_err(|reason| MetalError::NotSent {
                op: call.op,
                reason,
            })?;
        }
        let started = tokio::time::Instant::now();
        let url = format!("{}{}", self.inner.base_url, call.path);
        let mut request = self.inner.http.request(call.method.clone(), &url);
        if !call.query.is_empty() {
            request = request.query(&call.query);
        }
        if let Some(body) = call.body {
            let bytes = body.to_json().map_err(|e| {
                MetalError::Refused(format!("{}: cannot encode the request: {e}", call.op))
            })?;
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(bytes);
        }
        let exchange = async {
            let response = request.send().await?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = read_capped(response).await?;
            Ok::<_, reqwest::Error>((status, headers, body))
        };
        let outcome = tokio::time::timeout(self.inner.attempt_timeout, exchange).await;
        let status_label = match &outcome {
            Ok(Ok((s, _, _))) => s.as_u16().to_string(),
            Ok(Err(_)) => "error".to_string(),
            Err(_) => "timeout".to_string(),
        };
        self.inner.gate.metrics.observe(
            call.op.id(),
            status_label,
            started.elapsed().as_secs_f64(),
        );
        drop(admission);
        let (status, headers, body) = match outcome {
            Err(_) => {
                return Err(MetalError::Transient {
                    op: call.op,
                    reason: format!("no complete answer within {:?}", self.inner.attempt_timeout),
                });
            }
            Ok(Err(e)) => {
                return Err(MetalError::Transient {
                    op: call.op,
                    reason: describe_transport_error(&e),
                });
            }
            Ok(Ok(v)) => v,
        };
        let body = match body {
            Body::Complete(b) => b,
            Body::TooLarge => {
                return Err(MetalError::Undecodable {
                    op: call.op,
                    status: status.as_u16(),
                    detail: format!("answer larger than {MAX_BODY_BYTES} bytes"),
                    excerpt: String::new(),
                });
            }
        };
        if status.is_success() {
            if let Some(wait) = budget_spent(&headers) {
                self.inner.gate.hold(call.op, wait).await;
            }
            return Ok((status.as_u16(), body));
        }
        let messages = serde_json::from_slice::<ErrorBody>(&body)
            .map(ErrorBody::messages)
            .unwrap_or_else(|_| {
                if body.is_empty() {
                    vec![]
                } else {
                    vec![error::excerpt(&body)]
                }
            });
        let retry_after = if status == StatusCode::TOO_MANY_REQUESTS {
            let asked = retry_after(&headers);
            // The whole cluster waits, not only this call's retry: the
            // budget is the key's, shared by every process.
            self.inner
                .gate
                .hold(call.op, asked.unwrap_or(HOLD_WITHOUT_RETRY_AFTER))
                .await;
            asked
        } else {
            None
        };
        Err(error::from_status(
            call.op,
            status.as_u16(),
            messages,
            retry_after,
        ))
    }
}

impl Call<'_> {
    pub(super) fn clone_ref(&self) -> Call<'_> {
        Call {
            op: self.op,
            method: self.method.clone(),
            path: self.path.clone(),
            query: self.query.clone(),
            body: self.body,
        }
    }
}

pub(super) fn decode<T: DeserializeOwned>(
    op: Operation,
    status: u16,
    body: &[u8],
) -> Result<T, MetalError> {
    serde_json::from_slice(body).map_err(|e| MetalError::Undecodable {
        op,
        status,
        detail: e.to_string(),
        excerpt: error::excerpt(body),
    })
}

/// Success answers with no useful body (204, 202). Anything in the body is
/// ignored; the status already said it worked.
pub(super) fn no_content(_op: Operation, _status: u16, _body: &[u8]) -> Result<(), MetalError> {
    Ok(())
}

pub(super) enum Body {
    Complete(Vec<u8>),
    TooLarge,
}

pub(super) async fn read_capped(mut response: reqwest::Response) -> Result<Body, reqwest::Error> {
    if response
        .content_length()
        .is_some_and(|n| n > MAX_BODY_BYTES as u64)
    {
        return Ok(Body::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Ok(Body::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Body::Complete(body))
}

/// A 429 that does not say how long to wait still holds the cluster this
/// long before the next call.
const HOLD_WITHOUT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A success that reports the rate-limit budget spent
/// (`X-RateLimit-Remaining: 0`) asks for a pause until its reset.
fn budget_spent(headers: &HeaderMap) -> Option<Duration> {
    let remaining: u64 = headers
        .get("x-ratelimit-remaining")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    if remaining > 0 {
        return None;
    }
    retry_after(headers).filter(|wait| !wait.is_zero())
}

/// `Retry-After` in seconds, else `X-RateLimit-Reset` (a Unix time, or a
/// number of seconds when it is too small to be one), at most
/// `MAX_PROVIDER_WAIT`.
pub(super) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    asked_wait(headers).map(|w| w.min(crate::provider::discipline::MAX_PROVIDER_WAIT))
}

fn asked_wait(headers: &HeaderMap) -> Option<Duration> {
    let number =
        |name: &str| -> Option<u64> { headers.get(name)?.to_str().ok()?.trim().parse().ok() };
    if let Some(secs) = number("retry-after") {
        return Some(Duration::from_secs(secs));
    }
    let reset = number("x-ratelimit-reset")?;
    const A_UNIX_TIME: u64 = 1_000_000_000;
    if reset < A_UNIX_TIME {
        return Some(Duration::from_secs(reset));
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(reset.saturating_sub(now)))
}

pub(crate) use crate::provider::discipline::describe_transport_error;
