//! The actions that change the fleet itself: a pool's count, the machine
//! limit, a machine deprovisioned or protected, deletions paused. Each is
//! the CLI's own call (`shepherd::pools::set`, `shepherd::cluster::change`
//! and the SQL functions behind `shepherd machines …` and `pause
//! --deletions`), so the database judges the console as it judges the CLI
//! and SQL, and records who and why the same way.

use maud::html;

use super::actions::ActionForm;
use super::*;

/// What a fleet action did, for the page it returns to.
pub(super) struct Acted {
    /// The page to go back to.
    pub back: String,
}

/// `None` when `action` is not one of these.
pub(super) async fn fleet_action(
    state: &HttpState,
    action: &str,
    form: &ActionForm,
    by: &str,
) -> Option<Result<Acted, Failure>> {
    let acted = match action {
        "pool-count" => pool_count(state, form, by).await,
        "limit" => limit(state, form, by).await,
        "deprovision" | "protect" | "unprotect" => machine(state, action, form, by).await,
        "pause-deletions" | "resume-deletions" => deletions(state, action, form, by).await,
        _ => return None,
    };
    Some(acted)
}

/// A field the action needs, trimmed; missing or blank, a refusal that
/// asks for it.
fn required<'a>(field: &'a Option<String>, ask: &str) -> Result<&'a str, Failure> {
    field
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| Failure::BadRequest(ask.into()))
}

fn reason(form: &ActionForm) -> Result<&str, Failure> {
    required(
        &form.reason,
        "say why: the log records the reason with who acted",
    )
}

/// A pool's count, the rest of the pool as it is. Lowering it to 0 needs
/// the confirmation the CLI asks for (`--confirm-delete`); the pass deletes
/// the surplus within the deletion guards, as after `shepherd pools set`.
async fn pool_count(state: &HttpState, form: &ActionForm, by: &str) -> Result<Acted, Failure> {
    let reason = reason(form)?;
    let name = required(&form.pool, "which pool? (its name)")?;
    let count: u32 = form
        .count
        .as_deref()
        .map(str::trim)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            Failure::BadRequest(format!(
                "count {:?} is not a whole number from 0 to 1000",
                form.count.as_deref().unwrap_or("")
            ))
        })?;
    let confirm = form.confirm.as_deref() == Some("yes");
    let changed = async {
        let mut tx = state.pool.begin().await?;
        let rows = shepherd::pools::read(&mut tx).await?;
        let Some(row) = rows.iter().find(|r| r.name == name && !r.removed) else {
            return Ok(None);
        };
        let mut spec = row.pool();
        spec.count = count;
        let done = shepherd::pools::set(&mut tx, &spec, reason, by, confirm).await?;
        tx.commit().await?;
        Ok(Some(done))
    }
    .await
    .map_err(|e: sqlx::Error| database_failure("pool count", e))?;
    match changed {
        None => Err(Failure::NotFound(format!(
            "there is no pool {name} (or it was removed); declare pools with shepherd pools set"
        ))),
        Some(shepherd::pools::Change::Unchanged) => Err(Failure::Conflict(format!(
            "pool {name} has {count} places already; nothing was recorded"
        ))),
        Some(_) => Ok(Acted { back: "/".into() }),
    }
}

/// The cluster's machine limit (`max_machines`; 0 lifts it), as `shepherd
/// settings set max_machines` changes it.
async fn limit(state: &HttpState, form: &ActionForm, by: &str) -> Result<Acted, Failure> {
    let reason = reason(form)?;
    let value = required(&form.value, "which limit? (a whole number; 0: none)")?;
    shepherd::cluster::change(&state.pool, "max_machines", value, reason, by)
        .await
        .map_err(|e| database_failure("machine limit", e))?;
    Ok(Acted { back: "/".into() })
}

/// Deprovision (through the deletion job, which checks the request again
/// before it sends the delete) or scale-in protection.
async fn machine(
    state: &HttpState,
    action: &str,
    form: &ActionForm,
    by: &str,
) -> Result<Acted, Failure> {
    let reason = reason(form)?;
    let machine = required(&form.machine, "which machine? (its id or device id)")?;
    let what = format!("{action} {machine}");
    if action == "deprovision" {
        let _job: Option<String> =
            sqlx::query_scalar("select shepherd.deprovision_machine($1, $2, $3)")
                .bind(machine)
                .bind(reason)
                .bind(by)
                .fetch_one(&state.pool)
                .await
                .map_err(|e| database_failure(&what, e))?;
    } else {
        let on = action == "protect";
        let changed: bool = sqlx::query_scalar("select shepherd.protect_machine($1, $2, $3, $4)")
            .bind(machine)
            .bind(reason)
            .bind(by)
            .bind(on)
            .fetch_one(&state.pool)
            .await
            .map_err(|e| database_failure(&what, e))?;
        if !changed {
            return Err(Failure::Conflict(format!(
                "machine {machine} is {} already; nothing was recorded",
                if on { "protected" } else { "not protected" }
            )));
        }
    }
    Ok(Acted {
        back: "/machines".into(),
    })
}

async fn deletions(
    state: &HttpState,
    action: &str,
    form: &ActionForm,
    by: &str,
) -> Result<Acted, Failure> {
    let reason = reason(form)?;
    let pause = action == "pause-deletions";
    let sql = if pause {
        "select shepherd.pause_deletions($1, $2)"
    } else {
        "select shepherd.resume_deletions($1, $2)"
    };
    let changed: bool = sqlx::query_scalar(sql)
        .bind(reason)
        .bind(by)
        .fetch_one(&state.pool)
        .await
        .map_err(|e| database_failure(action, e))?;
    if !changed {
        return Err(Failure::Conflict(format!(
            "deletions are already {}; nothing was recorded",
            if pause { "paused" } else { "running" }
        )));
    }
    Ok(Acted { back: "/".into() })
}

/// The fleet's forms on the status page: deletions paused or not, the
/// limit, and each declared pool's count.
pub(super) fn fleet_forms(o: &Overview) -> maud::Markup {
    let limit = o.max_machines.map(|m| m.to_string()).unwrap_or_default();
    html! {
        @if o.deletions_paused.is_some() {
            form.inline method="post" action="/actions/resume-deletions" {
                input name="reason" aria-label="Reason (recorded with the action)" placeholder="why resume deletions" maxlength="1000" required;
                " " button type="submit" { "Resume deletions" }
            }
        } @else {
            form.inline method="post" action="/actions/pause-deletions" {
                input name="reason" aria-label="Reason (recorded with the action)" placeholder="why pause deletions" maxlength="1000" required;
                " " button type="submit" { "Pause deletions" }
            }
        }
        form.inline method="post" action="/actions/limit" {
            label { "Machine limit " input name="value" type="number" min="0" step="1" value=(limit) aria-label="Machine limit (0: none)" required; }
            " " input name="reason" aria-label="Reason (recorded with the action)" placeholder="why change the limit" maxlength="1000" required;
            " " button type="submit" { "Set the limit" }
        }
        @for p in o.desired.iter().filter(|p| !p.removed) {
            form.inline.pool-count method="post" action="/actions/pool-count" {
                input type="hidden" name="pool" value=(p.name);
                label { "Pool " strong { (p.name) } ": " input name="count" type="number" min="0" max="1000" step="1" value=(p.count) aria-label={ "Places of pool " (p.name) } required; }
                " " input name="reason" aria-label="Reason (recorded with the action)" placeholder="why change the pool" maxlength="1000" required;
                " " label.confirm { input type="checkbox" name="confirm" value="yes"; " delete its machines if it goes to 0" }
                " " button type="submit" { "Set the count" }
            }
        }
    }
}

/// A managed machine's actions on `/machines`: one reason, and the button
/// says what is done with it. Enter in the reason field presses the first
/// button, so the first is the harmless one and deletion comes last.
pub(super) fn machine_forms(machine: Uuid, protected: bool) -> maud::Markup {
    html! {
        form.inline.machine method="post" action="/actions/protect" {
            input type="hidden" name="machine" value=(machine);
            input name="reason" aria-label="Reason (recorded with the action)" placeholder="why" maxlength="1000" required;
            @if protected {
                " " button type="submit" formaction="/actions/unprotect" { "Unprotect" }
            } @else {
                " " button type="submit" formaction="/actions/protect" { "Protect" }
            }
            " " button type="submit" formaction="/actions/release" { "Release" }
            " " button.danger type="submit" formaction="/actions/deprovision" { "Deprovision" }
        }
    }
}
