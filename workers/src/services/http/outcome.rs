//! A job's outcome in an operator's words. The handlers' outcomes reach the
//! queue as their Rust debug text (`Retrying { next_attempt: 2, after: 30s }`);
//! the pages name the outcome and read its fields out plainly
//! (`to be tried again by a new job: next attempt 2, after 30s`).

use serde_json::Value;

/// What a job's last result says, in words: the outcome's name and its
/// fields, the failure for an error.
pub(super) fn outcome_words(result: Option<&Value>) -> String {
    let Some(result) = result else {
        return String::new();
    };
    if let Some(text) = result.get("Ok").and_then(Value::as_str) {
        let name: String = text.chars().take_while(|c| c.is_alphanumeric()).collect();
        let words = match name.as_str() {
            "Created" if text.contains("recovered: true") => {
                "created (found after an unseen answer)"
            }
            "Created" => "created",
            "GivenUp" => "given up",
            "RaceLost" => "race lost to another party",
            "Retrying" => "to be tried again by a new job",
            "Unresolved" => "outcome unknown: looking again later",
            "Refused" => "refused",
            "Skipped" => "nothing to do",
            "Assimilated" => "assimilated",
            "AlreadyManaged" => "already managed",
            "Rejected" => "rejected",
            "Deleted" if text.contains("already_gone: true") => "deleted (it was already gone)",
            "Deleted" => "deleted",
            "Waiting" => "waiting for the leave hook",
            "Failed" => "failed",
            "Cancelled" => "cancelled",
            "ReconcileOutcome" => "pass finished",
            _ => return short(text),
        };
        let detail = fields_in_words(&text[name.len()..]);
        return if detail.is_empty() {
            words.to_string()
        } else {
            short(&format!("{words}: {detail}"))
        };
    }
    match result.get("Err") {
        Some(Value::String(e)) => short(&format!("error: {e}")),
        Some(e) => short(&format!("error: {e}")),
        None => short(&result.to_string()),
    }
}

/// The outcome a job's row shows: a job waiting again (retried by an
/// operator, or handed back) still carries its last run's result, which
/// says what was, not what is.
pub(super) fn outcome_now(status: &str, claimed: bool, result: Option<&Value>) -> String {
    let words = outcome_words(result);
    if words.is_empty() || claimed || !matches!(status, "Pending" | "Queued") {
        return words;
    }
    format!("waiting again (its last run: {words})")
}

/// Fields the outcome's name already says.
const SAID: [&str; 2] = ["recovered", "already_gone"];

/// `{ next_attempt: 2, device: "d1", other: None, gone: true, ids: [a, b] }`
/// as `next attempt 2, device d1, gone, ids 2`: nothing for what is absent,
/// false or empty, the name alone for what is true, a count for a list.
/// Text that is not a debug struct is given back trimmed.
fn fields_in_words(detail: &str) -> String {
    let detail = detail.trim();
    let Some(inner) = detail.strip_prefix('{').and_then(|d| d.strip_suffix('}')) else {
        return detail.to_string();
    };
    let mut said = vec![];
    for field in top_level(inner) {
        let Some((key, value)) = field.split_once(':') else {
            said.push(field.trim().to_string());
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        if SAID.contains(&key) {
            continue;
        }
        let name = key.replace('_', " ");
        let value = value
            .strip_prefix("Some(")
            .and_then(|v| v.strip_suffix(')'))
            .unwrap_or(value);
        match value {
            "None" | "false" | "[]" | "" => {}
            "true" => said.push(name),
            list if list.starts_with('[') => {
                let items = top_level(&list[1..list.len().saturating_sub(1)]).len();
                said.push(format!("{name} {items}"));
            }
            quoted if quoted.starts_with('"') && quoted.ends_with('"') && quoted.len() >= 2 => {
                let text = quoted[1..quoted.len() - 1]
                    .replace("\\\"", "\"")
                    .replace("\\\\", "\\");
                said.push(format!("{name} {text}"));
            }
            other => said.push(format!("{name} {other}")),
        }
    }
    said.join(", ")
}

/// `inner` split at the commas outside strings, brackets and braces.
fn top_level(inner: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut quoted, mut escaped, mut from) = (vec![], 0i32, false, false, 0);
    for (i, c) in inner.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '{' | '[' | '(' if !quoted => depth += 1,
            '}' | ']' | ')' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                parts.push(&inner[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[from..]);
    parts.retain(|p| !p.trim().is_empty());
    parts
}

/// At most 120 characters, so a table row stays a row.
pub(super) fn short(text: &str) -> String {
    if text.chars().count() > 120 {
        let cut: String = text.chars().take(119).collect();
        format!("{cut}…")
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn words(ok: &str) -> String {
        outcome_words(Some(&json!({ "Ok": ok })))
    }

    #[test]
    fn outcomes_read_as_words_with_their_fields() {
        assert_eq!(
            words("Retrying { next_attempt: 2, after: 30s }"),
            "to be tried again by a new job: next attempt 2, after 30s"
        );
        assert_eq!(
            words(r#"Created { device: "sv_8v2", recovered: true }"#),
            "created (found after an unseen answer): device sv_8v2"
        );
        assert_eq!(
            words(r#"RaceLost { other_device: Some("d-9") }"#),
            "race lost to another party: other device d-9"
        );
        assert_eq!(
            words("RaceLost { other_device: None }"),
            "race lost to another party"
        );
        assert_eq!(
            words(r#"GivenUp { class: Permanent, cause: "422: \"no stock, sorry\"" }"#),
            r#"given up: class Permanent, cause 422: "no stock, sorry""#
        );
        assert_eq!(
            words("Deleted { already_gone: true }"),
            "deleted (it was already gone)"
        );
        assert_eq!(
            words(
                "ReconcileOutcome { run: None, skipped: false, coalesced: false, refused: None, \
                 managed: 3, in_flight: 0, at_limit: true, enqueued: [a, b], adopted: [] }"
            ),
            "pass finished: managed 3, in flight 0, at limit, enqueued 2"
        );
    }

    #[test]
    fn a_job_waiting_again_shows_its_last_run_as_past() {
        let cancelled = serde_json::json!({"Err": "cancelled by cli:alice: wrong place"});
        assert_eq!(
            outcome_now("Pending", false, Some(&cancelled)),
            "waiting again (its last run: error: cancelled by cli:alice: wrong place)"
        );
        assert_eq!(
            outcome_now("Killed", false, Some(&cancelled)),
            "error: cancelled by cli:alice: wrong place"
        );
        // Claimed: running now, its result is the one being made.
        assert!(!outcome_now("Queued", true, Some(&cancelled)).starts_with("waiting"));
        assert_eq!(outcome_now("Pending", false, None), "");
    }

    #[test]
    fn what_is_not_an_outcome_is_shown_as_it_is() {
        assert_eq!(words("Something new"), "Something new");
        assert_eq!(
            outcome_words(Some(&json!({ "Err": "the database went away" }))),
            "error: the database went away"
        );
        assert_eq!(outcome_words(None), "");
        assert_eq!(words(&"x".repeat(200)).chars().count(), 120);
    }
}
