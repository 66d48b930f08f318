//! The graceful leave: the cluster's leave hook asked (an acknowledgement
//! through the CLI or SQL, or an HTTP endpoint), its state kept in the
//! log so that every run, rerun and sweep keeps the same promise, and told
//! when the machine stays after all.

use chrono::{TimeDelta, Utc};

use super::*;

/// How often a machine waiting for its leave hook asks again.
pub(super) const LEAVE_POLL: Duration = Duration::from_secs(5);
/// How long one call to an HTTP leave hook may take.
const HOOK_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) enum Leave {
    /// The delete may be sent.
    Go,
    Done(DeleteOutcome),
}

/// The graceful leave: the leave hook's answer, or its deadline.
pub(super) async fn leave(
    ctx: &JobContext,
    settings: &ClusterSettings,
    args: &DeleteMachineArgs,
    leaving: &Leaving,
    job_id: &str,
) -> Result<Leave, JobError> {
    let l = &settings.lifecycle;
    let hook = &l.leave_hook;
    if *hook == LeaveHook::None || (leaving.deletion.cause == "failed" && l.failed_skip_leave) {
        return Ok(Leave::Go);
    }
    // Pausing deletions pauses the hooks: no machine is asked to drain for
    // a delete that is not going to be sent.
    if deletions_paused(ctx).await? {
        let until = Utc::now() + TimeDelta::from_std(LEAVE_POLL * 6).unwrap_or_default();
        return Ok(Leave::Done(wait_until(ctx, args, until).await?));
    }
    // Asked from now on: the deadline counts from the first ask, durably,
    // whoever asks next.
    let asked_at = match leaving.deletion.asked_at {
        Some(at) => at,
        None => {
            note(
                ctx,
                job_id,
                LeaveAsked {
                    machine_id: args.machine_id,
                    provider_id: args.device.clone(),
                    request: args.request,
                    by: match hook {
                        LeaveHook::Http(url) => format!("hook:{}", hook_host(url)),
                        _ => "ack".into(),
                    },
                },
            )
            .await?;
            Utc::now()
        }
    };
    if let LeaveHook::Http(url) = hook {
        match call_hook(ctx, url, HookCall::Leaving, args, leaving).await {
            HookAnswer::Done => {
                note(
                    ctx,
                    job_id,
                    LeaveAcknowledged {
                        machine_id: args.machine_id,
                        provider_id: args.device.clone(),
                        request: args.request,
                        by: format!("hook:{}", hook_host(url)),
                    },
                )
                .await?;
                return Ok(Leave::Go);
            }
            HookAnswer::Draining | HookAnswer::NotYet => {}
        }
    }
    let deadline = asked_at + TimeDelta::from_std(l.leave_timeout).unwrap_or(TimeDelta::MAX);
    let now = Utc::now();
    if now < deadline {
        let until = (now + TimeDelta::from_std(LEAVE_POLL).unwrap_or_default()).min(deadline);
        return Ok(Leave::Done(wait_until(ctx, args, until).await?));
    }
    let action = l.leave_deadline;
    tracing::warn!(device = %args.device, action = action.as_str(), "the leave hook did not answer in time");
    let timed_out = LeaveTimedOut {
        machine_id: args.machine_id,
        provider_id: args.device.clone(),
        request: args.request,
        action: action.as_str().into(),
    };
    Ok(match action {
        LeaveDeadline::Proceed => {
            note(ctx, job_id, timed_out).await?;
            Leave::Go
        }
        LeaveDeadline::GiveUp => {
            let reason = format!(
                "the leave hook did not answer within {}; the machine stays",
                crate::config::format_duration(l.leave_timeout)
            );
            // The deletion ends as failed, as every other that keeps its
            // machine does, in the transaction that says why.
            let failed = DeletionFailed {
                machine_id: args.machine_id,
                provider_id: args.device.clone(),
                request: args.request,
                message: reason.clone(),
            };
            let mut tx = ctx.pool.begin().await?;
            crate::events::record(
                &mut tx,
                vec![
                    crate::events::NewEvent::new(timed_out).caused_by(job_id),
                    crate::events::NewEvent::new(failed).caused_by(job_id),
                ],
            )
            .await?;
            tx.commit().await?;
            tell_hook_it_stays(ctx, settings, args, leaving).await;
            Leave::Done(DeleteOutcome::Failed { reason })
        }
    })
}

/// What the deletion tells an HTTP leave hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HookCall {
    /// The machine is to leave: drain it, and answer when it may go.
    Leaving,
    /// The deletion was cancelled: the machine stays.
    Cancelled,
}

impl HookCall {
    fn as_str(self) -> &'static str {
        match self {
            HookCall::Leaving => "leaving",
            HookCall::Cancelled => "cancelled",
        }
    }
}

/// What an HTTP leave hook said. Only an explicit answer counts: 200 or
/// 204 is "done, the machine may go"; 202 is "still draining, ask again";
/// anything else (a redirect to a log-in page, an error, no answer) is no
/// consent, and the deadline decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HookAnswer {
    Done,
    Draining,
    NotYet,
}

/// The hook's host, as events and logs name it: the whole address may
/// carry a token in its path or query.
fn hook_host(url: &str) -> String {
    let host = reqwest::Url::parse(url)
        .ok()
        .and_then(|u| {
            let host = u.host_str()?.to_string();
            Some(match u.port() {
                Some(port) => format!("{host}:{port}"),
                None => host,
            })
        })
        .unwrap_or_else(|| "unparsable address".into());
    crate::text::bounded(&host, 255)
}

/// The signature of a hook request: HMAC-SHA256 of `<timestamp>.<body>`
/// under the cluster's hook secret, in hex, as `X-Shepherd-Signature:
/// sha256=<hex>` beside `X-Shepherd-Timestamp` (docs/pools.md): the hook
/// can tell shepherd's requests from anyone's, and a replayed one by its
/// age.
pub fn hook_signature(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac =
        hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// POSTs the machine to the hook, signed when the cluster has a secret,
/// redirects not followed (a hook behind a log-in proxy answers 302 to a
/// page that answers 200: no consent).
async fn call_hook(
    ctx: &JobContext,
    url: &str,
    call: HookCall,
    args: &DeleteMachineArgs,
    leaving: &Leaving,
) -> HookAnswer {
    let body = serde_json::json!({
        "event": call.as_str(),
        "machine_id": args.machine_id,
        "device": args.device,
        "hostname": leaving.hostname,
        "pool": leaving.deletion.pool,
        "cause": leaving.deletion.cause,
        "message": leaving.deletion.message,
        "request": args.request,
    });
    let host = hook_host(url);
    let client = match reqwest::Client::builder()
        .timeout(HOOK_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "cannot build the leave hook's HTTP client");
            return HookAnswer::NotYet;
        }
    };
    let body = body.to_string();
    let mut request = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json");
    if let Some(secret) = &ctx.config.leave_hook_secret {
        let timestamp = Utc::now().timestamp();
        let signature = hook_signature(secret.expose().as_bytes(), timestamp, body.as_bytes());
        request = request
            .header("x-shepherd-timestamp", timestamp.to_string())
            .header("x-shepherd-signature", format!("sha256={signature}"));
    }
    match request.body(body).send().await {
        Ok(r) => match r.status().as_u16() {
            200 | 204 => HookAnswer::Done,
            202 => {
                tracing::info!(device = %args.device, %host, "the leave hook is still draining the machine");
                HookAnswer::Draining
            }
            status => {
                tracing::warn!(device = %args.device, %host, status, event = call.as_str(), "the leave hook's answer is no consent (only 200 or 204 is; 202 means still draining)");
                HookAnswer::NotYet
            }
        },
        Err(e) => {
            tracing::warn!(device = %args.device, %host, error = %crate::provider::discipline::describe_transport_error(&e), "the leave hook did not answer");
            HookAnswer::NotYet
        }
    }
}

pub(super) async fn deletions_paused(ctx: &JobContext) -> Result<bool, JobError> {
    Ok(sqlx::query_scalar(
        "select exists(select 1 from shepherd.controls where name = 'deletions' and paused)",
    )
    .fetch_one(&ctx.pool)
    .await?)
}

/// A hook that may have been asked to drain the machine is told it stays
/// (best effort: the ending is recorded whatever it says).
pub(super) async fn tell_hook_it_stays(
    ctx: &JobContext,
    settings: &ClusterSettings,
    args: &DeleteMachineArgs,
    leaving: &Leaving,
) {
    if let LeaveHook::Http(url) = &settings.lifecycle.leave_hook {
        call_hook(ctx, url, HookCall::Cancelled, args, leaving).await;
    }
}

#[cfg(test)]
mod tests {
    use super::hook_signature;

    #[test]
    fn a_hook_signature_is_hmac_sha256_of_the_timestamp_and_body() {
        // As Python's hmac.new(key, b"1700000000." + body, sha256) computes it.
        assert_eq!(
            hook_signature(
                b"a-hook-secret-of-16+",
                1_700_000_000,
                br#"{"event":"leaving"}"#
            ),
            "6d02779f22aa871c91bbdaa0856cc7aa5cd7508e73212a5e1baaa6abff15ed84"
        );
    }
}
