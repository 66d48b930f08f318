//! The page handlers: the status page and the history of one reservation
//! or device.

use super::*;

pub(super) async fn front_page(
    State(state): State<HttpState>,
    headers: axum::http::HeaderMap,
    Query(done): Query<Done>,
) -> Result<Html<String>, Failure> {
    const WHAT: &str = "status page";
    let viewer = viewer(&state, &headers).await;
    let overview = fleet::overview(&state.pool)
        .await
        .map_err(|e| database_failure(WHAT, e))?;
    // Only the newest machines: the page refreshes every 5 s, and a fleet
    // of thousands is on /machines.
    let machines: Vec<ManagedMachine> = sqlx::query_as::<
        _,
        (
            Uuid,
            String,
            String,
            Option<Uuid>,
            Option<String>,
            DateTime<Utc>,
            bool,
            Option<DateTime<Utc>>,
        ),
    >(
        "select machine_id, provider, provider_id, reservation_id, hostname, assimilated_at,
                protected, ready_at
         from shepherd.managed_machines order by assimilated_at desc, machine_id limit $1",
    )
    .bind(STATUS_MACHINES as i64)
    .fetch_all(&state.pool)
    .await
    .map_err(|e| database_failure(WHAT, e))?
    .into_iter()
    .map(
        |(
            machine_id,
            provider,
            provider_id,
            reservation_id,
            hostname,
            assimilated_at,
            protected,
            ready_at,
        )| {
            ManagedMachine {
                machine_id,
                provider,
                provider_id,
                reservation_id,
                hostname,
                assimilated_at,
                protected,
                ready_at,
            }
        },
    )
    .collect();
    // A pass's routine events (started, listed, pools surveyed, finished,
    // coalesced) are summed up under "Last reconcile" and "Pools"; among
    // the recent events they would crowd out what happened to machines.
    let mut events = store::read_recent_except(
        &state.pool,
        RECENT_EVENTS,
        &[
            "reconcile_started",
            "reservations_listed",
            "pools_surveyed",
            "reconcile_finished",
            "reconcile_coalesced",
        ],
    )
    .await
    .map_err(|e| store_failure(WHAT, e))?;
    // What just happened belongs at the top.
    events.reverse();
    let rows: Vec<EventRow> = events.into_iter().map(EventRow::from).collect();
    Ok(layout(
        "shepherd",
        true,
        status_page(&overview, &machines, &rows, &viewer, &done, &state.voice()),
    ))
}

pub(super) fn parse_id(kind: Kind, raw: &str) -> Result<Uuid, Failure> {
    raw.parse().map_err(|_| {
        Failure::BadRequest(format!(
            "“{raw}” is not a {kind} id: expected a UUID such as 6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f."
        ))
    })
}

pub(super) async fn reservation_page(
    State(state): State<HttpState>,
    Path(raw): Path<String>,
) -> Result<Html<String>, Failure> {
    let id = parse_id(Kind::Reservation, &raw)?;
    let events = store::read_stream(&state.pool, &format!("reservation/{id}"))
        .await
        .map_err(|e| store_failure("reservation history", e))?;
    history(
        Kind::Reservation,
        &id.to_string(),
        state.unit_label(id),
        events.into_iter().map(EventRow::from).collect(),
    )
}

pub(super) async fn device_page(
    State(state): State<HttpState>,
    Path(raw): Path<String>,
) -> Result<Html<String>, Failure> {
    // Any provider's machine id: a Metal UUID, a Latitude `sv_...`.
    if !super::html::machine_id_ok(&raw) {
        return Err(Failure::BadRequest(format!(
            "“{raw}” is not a machine id: expected the provider's id, such as a Metal device's \
             UUID or a Latitude.sh server's sv_... id."
        )));
    }
    let id = raw;
    let rows: Vec<(i64, DateTime<Utc>, String, Value)> = sqlx::query_as(
        "select event_position, recorded_at, event_type, body from shepherd.device_history($1::text)",
    )
    .bind(&id)
    .fetch_all(&state.pool)
    .await
    .map_err(|e| database_failure("device history", e))?;
    let rows = rows
        .into_iter()
        .map(|(position, recorded_at, event_type, body)| EventRow {
            position,
            recorded_at,
            event_type,
            stream: None,
            body,
            job_id: None,
        })
        .collect();
    history(Kind::Device, &id, None, rows)
}

pub(super) fn history(
    kind: Kind,
    id: &str,
    label: Option<String>,
    rows: Vec<EventRow>,
) -> Result<Html<String>, Failure> {
    if rows.is_empty() {
        // The discrepancy banner links devices nobody manages; say why they
        // have no history rather than leave the operator at a bare 404.
        let hint = match kind {
            Kind::Device => " A device a reconcile found unknown has none until it is adopted.",
            Kind::Reservation => "",
        };
        return Err(Failure::NotFound(format!(
            "No events for {kind} {id}: shepherd has recorded nothing about it.{hint}"
        )));
    }
    Ok(layout(
        &format!("shepherd · {kind} {id}"),
        false,
        history_page(kind, id, label.as_deref(), &rows),
    ))
}
