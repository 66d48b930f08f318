//! The last look before a DELETE: what the deletion rests on is checked
//! again against a fresh read of the machine (and, for a surplus, of the
//! provider's listing), and the DELETE is fenced to what was checked.

use futures::future::BoxFuture;

use super::*;

/// What the last look before the delete found.
pub(super) enum Recheck {
    /// The cause still holds; for a surplus, the pool as it stood then,
    /// which the fence holds the delete to.
    Holds(Option<PoolThen>),
    /// The cause no longer holds: the deletion is cancelled.
    NoLonger(String),
    /// The provider could not be asked, or its answer proves nothing of
    /// this machine: no evidence, so nothing is sent.
    CannotTell(String),
    /// The provider answered "not found": one absence, judged by
    /// `jobs::gone` before the machine is believed gone.
    NotFound(String),
}

/// A surplus's pool, which the fence counts again at the write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PoolThen {
    name: String,
    /// Every place a machine of the pool may stand on.
    units: Vec<Uuid>,
}

/// How a pool stands now, by what the database knows: the machines that
/// keep standing if this one goes, against what the pool wants.
struct Standing {
    wanted: u32,
    /// The pool's other managed machines that are not leaving and not
    /// suspected gone (a "not found" since their last sighting).
    others: u32,
    /// The cluster has the pool.
    known: bool,
}

/// A pool's count and its other machines still standing, read at once.
static STANDING: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "select p.count, p.removed,
                (select count(*) from shepherd.managed_machines m
                 where m.reservation_id = any($2) and m.machine_id <> $3
                   and not exists (select 1 from shepherd.pending_deletions d
                                   where d.machine_id = m.machine_id)
                   and not exists (select 1 from shepherd.events e
                                   where {}))
         from (select 1) one
         left join shepherd.pools p on p.name = $1",
        crate::jobs::gone::NOT_FOUND_SINCE_SEEN
    )
});

async fn standing(
    db: &sqlx::PgPool,
    pool: &PoolThen,
    machine: Uuid,
) -> Result<Standing, sqlx::Error> {
    let (count, removed, others): (Option<i32>, Option<bool>, i64) =
        sqlx::query_as(sqlx::AssertSqlSafe(STANDING.as_str()))
            .bind(&pool.name)
            .bind(&pool.units)
            .bind(machine)
            .fetch_one(db)
            .await?;
    Ok(Standing {
        wanted: match removed {
            Some(false) => count.unwrap_or(0).max(0) as u32,
            _ => 0,
        },
        others: others.max(0) as u32,
        known: count.is_some(),
    })
}

/// Checks again, under the unit's lock and against a fresh read of the
/// machine, that what the deletion rests on still holds (Karpenter
/// validates a disruption the same way just before it acts): the machine
/// is still ours and not protected, a failed one still failed, one never
/// ready still deploying and never ready, a surplus still a surplus
/// against what the provider lists now.
pub(super) async fn recheck(
    ctx: &JobContext,
    args: &DeleteMachineArgs,
    leaving: &Leaving,
) -> Result<Recheck, JobError> {
    if leaving.protected {
        return Ok(Recheck::NoLonger("the machine is protected".into()));
    }
    let facts = match ctx.provider.machine(&args.device).await {
        Ok(facts) => facts,
        Err(e) if e.not_found() => return Ok(Recheck::NotFound(e.to_string())),
        Err(e) => {
            return Ok(Recheck::CannotTell(format!(
                "the machine could not be read before its delete: {e}"
            )));
        }
    };
    // Only an answer about this very server, in a project, says anything.
    if let Some(unproven) = &facts.unproven {
        return Ok(Recheck::CannotTell(unproven.clone()));
    }
    if let Some(foreign) = &facts.foreign {
        return Ok(Recheck::NoLonger(format!(
            "not provably ours any more: {foreign}"
        )));
    }
    if leaving.hostname.is_some() && facts.hostname != leaving.hostname {
        return Ok(Recheck::NoLonger(format!(
            "not provably ours any more: its hostname is {} now, not {}",
            facts
                .hostname
                .as_deref()
                .map(crate::text::bounded_word)
                .unwrap_or_else(|| "none".into()),
            leaving.hostname.as_deref().unwrap_or_default()
        )));
    }
    // A sighting: an earlier "not found" of it is no longer half of a
    // proof that it is gone.
    crate::jobs::gone::seen(ctx, &args.device, facts.status.as_deref()).await?;
    let word = |f: &crate::provider::MachineFacts| {
        f.status
            .as_deref()
            .map(crate::text::bounded_word)
            .unwrap_or_else(|| "nothing".into())
    };
    match leaving.deletion.cause.as_str() {
        "failed" if !facts.failed() => Ok(Recheck::NoLonger(format!(
            "its deployment no longer reads as failed (the provider says {})",
            word(&facts)
        ))),
        "failed" => Ok(Recheck::Holds(None)),
        "not_ready" if leaving.ready_once => Ok(Recheck::NoLonger(
            "it was ready once: a machine that ran is not replaced as never ready".into(),
        )),
        "not_ready" if facts.condition != crate::provider::Condition::Deploying => {
            Ok(Recheck::NoLonger(format!(
                "it is no longer deploying (the provider says {})",
                word(&facts)
            )))
        }
        "not_ready" => Ok(Recheck::Holds(None)),
        "surplus" | "pool_removed" => surplus_holds(ctx, args, leaving, &facts).await,
        "operator" => operator_asked(ctx, args).await,
        "unplaced" => unplaced_holds(ctx, &facts).await,
        other => Ok(Recheck::NoLonger(format!(
            "its cause {:?} is not one shepherd deletes for",
            crate::text::bounded_word(other)
        ))),
    }
}

/// An operator's deletion holds only with the operator's request in the
/// log: `deletion_requested` with cause `operator` is an event only a role
/// that may operate records, so a row written into the views or the queue
/// by any other role deletes nothing.
async fn operator_asked(ctx: &JobContext, args: &DeleteMachineArgs) -> Result<Recheck, JobError> {
    // This machine's, this request's, and not ended: an operator's old
    // request that was cancelled, refused or done licenses nothing more.
    let asked: bool = sqlx::query_scalar(
        "select exists(select 1 from shepherd.events
                       where stream = 'device/' || $1
                         and event_type = 'deletion_requested'
                         and body->>'cause' = 'operator'
                         and body->>'request' = $2
                         and body->>'machine_id' = $3)
            and not exists(select 1 from shepherd.events
                           where stream = 'device/' || $1
                             and event_type in ('deletion_cancelled', 'deletion_failed',
                                                'machine_deleted')
                             and body->>'request' = $2)",
    )
    .bind(&args.device)
    .bind(args.request.to_string())
    .bind(args.machine_id.to_string())
    .fetch_one(&ctx.pool)
    .await?;
    Ok(if asked {
        Recheck::Holds(None)
    } else {
        Recheck::NoLonger(
            "no operator's request for it is in the event log (a deletion only an operator's \
             role records)"
                .into(),
        )
    })
}

/// A machine deleted for standing on no place of the pools still stands
/// on none, as the provider names it now, and the cluster has pools at all
/// (a provider without them, Metal, has no places to stand on).
async fn unplaced_holds(
    ctx: &JobContext,
    facts: &crate::provider::MachineFacts,
) -> Result<Recheck, JobError> {
    let pools: bool = sqlx::query_scalar("select exists(select 1 from shepherd.pools)")
        .fetch_one(&ctx.pool)
        .await?;
    if !pools {
        return Ok(Recheck::NoLonger(
            "the cluster has no pools: no machine of it stands on a place".into(),
        ));
    }
    Ok(match facts.unit.and_then(|u| ctx.provider.unit_place(u)) {
        None => Recheck::Holds(None),
        Some((pool, index)) => {
            Recheck::NoLonger(format!("it stands on place {index} of pool {pool} now"))
        }
    })
}

/// A surplus still holds when the pool's other machines (managed, not
/// leaving, not suspected gone) are at least its count: a machine the
/// provider took away meanwhile, or a pool raised, leaves nothing to shed.
/// Counted from what the database knows, not from a listing of the whole
/// project per deletion; the fence counts again at the write.
async fn surplus_holds(
    ctx: &JobContext,
    args: &DeleteMachineArgs,
    leaving: &Leaving,
    facts: &crate::provider::MachineFacts,
) -> Result<Recheck, JobError> {
    // A pass names the pool of every surplus it finds: one without, or
    // of a pool the cluster never had, is no pass's.
    let Some(pool) = &leaving.deletion.pool else {
        return Ok(Recheck::NoLonger(
            "a surplus that names no pool is not one a pass found".into(),
        ));
    };
    let then = PoolThen {
        name: pool.clone(),
        units: ctx.provider.pool_units(pool),
    };
    let now = standing(&ctx.pool, &then, args.machine_id).await?;
    if !now.known {
        return Ok(Recheck::NoLonger(format!(
            "the cluster has no pool {:?}",
            crate::text::bounded_word(pool)
        )));
    }
    // And the machine stands on the pool, as the provider names it now.
    let place = facts.unit.and_then(|u| ctx.provider.unit_place(u));
    if place.as_ref().is_none_or(|(p, _)| p != pool) {
        return Ok(Recheck::NoLonger(format!(
            "the provider does not place it in pool {pool}"
        )));
    }
    if now.others < now.wanted {
        return Ok(Recheck::NoLonger(format!(
            "pool {pool} no longer holds more than its count of {}: {} other machines of it stand",
            now.wanted, now.others
        )));
    }
    Ok(Recheck::Holds(Some(then)))
}

/// The fence's reads, in one statement: the deletion still this
/// request's, the machine protected (as the pass and the read judge it,
/// `fleet::PROTECTED`), deletions paused.
static FENCE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "select exists(select 1 from shepherd.pending_deletions
                       where machine_id = $1 and request = $2),
                coalesce((select {} from shepherd.managed_machines m
                          where m.machine_id = $1), false),
                exists(select 1 from shepherd.controls where name = 'deletions' and paused)",
        crate::fleet::PROTECTED
    )
});

/// The fence of a deletion: the unit's lock still holds (where there is a
/// unit), the deletion is still this request's, the machine is not
/// protected, deletions are not paused, and a surplus's pool, counted again
/// at this moment, keeps its count without this machine (a deprovision or
/// a raise that landed while the DELETE waited for the write budget).
pub(super) struct DeletionFence<'a> {
    pub(super) lock: Option<&'a PlaceLock>,
    pub(super) pool: &'a sqlx::PgPool,
    pub(super) machine: Uuid,
    pub(super) request: String,
    /// A surplus's pool, counted again right before the DELETE leaves.
    pub(super) pool_then: Option<PoolThen>,
}

impl Fence for DeletionFence<'_> {
    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            if let Some(lock) = self.lock {
                lock.standing().await?;
            }
            let (ours, protected, paused): (bool, bool, bool) =
                sqlx::query_as(sqlx::AssertSqlSafe(FENCE.as_str()))
                    .bind(self.machine)
                    .bind(&self.request)
                    .fetch_one(self.pool)
                    .await
                    .map_err(|e| format!("the deletion could not be checked: {e}"))?;
            if let Some(then) = &self.pool_then {
                let now = standing(self.pool, then, self.machine)
                    .await
                    .map_err(|e| format!("the deletion could not be checked: {e}"))?;
                if now.others < now.wanted {
                    return Err(format!(
                        "pool {} would fall below its count of {}: {} other machines of it stand",
                        then.name, now.wanted, now.others
                    ));
                }
            }
            if !ours {
                Err("the deletion has ended or another owns it".into())
            } else if protected {
                Err("the machine is protected now".into())
            } else if paused {
                Err("deletions are paused now".into())
            } else {
                Ok(())
            }
        })
    }
}
