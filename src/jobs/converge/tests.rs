use std::collections::HashMap;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use uuid::Uuid;

use super::*;

fn member(index: u32, health: Health, age_minutes: i64) -> Member {
    Member {
        device: format!("sv_{index}"),
        machine_id: Uuid::new_v4(),
        unit: Uuid::new_v4(),
        index,
        health,
        ready_once: health == Health::Ready,
        made_at: Some(Utc::now() - TimeDelta::minutes(age_minutes)),
        created_at: Some(Utc::now() - TimeDelta::minutes(age_minutes)),
        protected: false,
        leaving: false,
        adopted: false,
        billing: None,
    }
}

fn policy() -> Policy {
    Policy {
        paused: false,
        budget_percent: 10,
        budget_min: 100,
        max_unhealthy_percent: 40,
        ready_deadline: Duration::from_secs(1800),
        now: Utc::now(),
        prices: Default::default(),
    }
}

fn target(count: u32, members: Vec<Member>) -> Target {
    Target {
        pool: "web".into(),
        count,
        removed: false,
        scope: None,
        members,
    }
}

fn chosen(plan: &Plan) -> Vec<(u32, Cause)> {
    plan.delete
        .iter()
        .map(|d| (d.member.index, d.cause))
        .collect()
}

#[test]
fn a_pool_lowered_sheds_the_failed_then_the_unready_then_the_newest() {
    let members = vec![
        member(0, Health::Ready, 100),
        member(1, Health::Ready, 10),
        member(2, Health::Deploying, 5),
        member(3, Health::Failed, 20),
        member(4, Health::Ready, 1),
        member(5, Health::Ready, 50),
    ];
    let p = plan(&[target(2, members)], &HashMap::new(), &policy());
    assert_eq!(
        chosen(&p),
        vec![
            (3, Cause::Surplus),
            (2, Cause::Surplus),
            (4, Cause::Surplus),
            (1, Cause::Surplus)
        ]
    );
    assert!(p.held.is_empty());
}

#[test]
fn a_protected_machine_is_never_deleted_and_that_is_said() {
    let mut members = vec![member(0, Health::Ready, 100), member(1, Health::Failed, 1)];
    members[1].protected = true;
    let p = plan(&[target(1, members)], &HashMap::new(), &policy());
    // The failed one is protected: the newest other one goes instead.
    assert_eq!(chosen(&p), vec![(0, Cause::Surplus)]);
    let mut members = vec![member(0, Health::Ready, 100), member(1, Health::Ready, 1)];
    members[0].protected = true;
    members[1].protected = true;
    let p = plan(&[target(1, members)], &HashMap::new(), &policy());
    assert!(p.delete.is_empty());
    assert_eq!(p.held[0].guard, Guard::Protected);
    // A protected failed machine is not replaced either (in a pool of 5,
    // where max_unhealthy lets one be).
    let mut members: Vec<Member> = (0..5).map(|i| member(i, Health::Ready, 1)).collect();
    members[0].health = Health::Failed;
    members[0].protected = true;
    let p = plan(&[target(5, members)], &HashMap::new(), &policy());
    assert!(p.delete.is_empty());
    assert_eq!((p.held[0].guard, p.held[0].count), (Guard::Protected, 1));
}

#[test]
fn a_failed_machine_and_one_not_ready_past_the_deadline_are_replaced() {
    let members = vec![
        member(0, Health::Ready, 100),
        member(1, Health::Failed, 3),
        member(2, Health::Deploying, 45),
        member(3, Health::Deploying, 5),
        member(4, Health::Ready, 100),
    ];
    let p = plan(&[target(5, members)], &HashMap::new(), &policy());
    assert_eq!(chosen(&p), vec![(1, Cause::Failed), (2, Cause::NotReady)]);
    assert!(p.delete.iter().all(|d| d.cause.replaces()));
}

#[test]
fn too_many_unhealthy_at_once_is_an_outage_and_nothing_is_replaced() {
    let members = vec![
        member(0, Health::Failed, 1),
        member(1, Health::Failed, 1),
        member(2, Health::Ready, 1),
        member(3, Health::Ready, 1),
        member(4, Health::Failed, 1),
    ];
    // 40 % of 5 is 2: three failed is an outage.
    let p = plan(&[target(5, members)], &HashMap::new(), &policy());
    assert!(p.delete.is_empty(), "{p:?}");
    assert_eq!((p.held[0].guard, p.held[0].count), (Guard::Unhealthy, 3));
    // Rounded down: 40 % of 2 is none, so one failed of 2 is held, and a
    // pool of one alone on its plan and site never has its machine
    // replaced on the provider's word.
    let p = plan(
        &[target(
            2,
            vec![member(0, Health::Failed, 1), member(1, Health::Ready, 1)],
        )],
        &HashMap::new(),
        &policy(),
    );
    assert!(p.delete.is_empty(), "{p:?}");
    assert_eq!(p.held[0].guard, Guard::Unhealthy);
    let p = plan(
        &[target(1, vec![member(0, Health::Failed, 1)])],
        &HashMap::new(),
        &policy(),
    );
    assert!(p.delete.is_empty(), "{p:?}");
    assert_eq!(p.held[0].guard, Guard::Unhealthy);
    assert!(p.held[0].message.contains("rounded down"), "{p:?}");
}

fn scoped(name: &str, scope: &str, count: u32, members: Vec<Member>) -> Target {
    Target {
        pool: name.into(),
        count,
        removed: false,
        scope: Some(scope.into()),
        members,
    }
}

#[test]
fn max_unhealthy_holds_across_the_pools_of_one_plan_and_site() {
    let healthy = |n: u32| (0..n).map(|i| member(i, Health::Ready, 1)).collect();
    // A pool of one whose machine failed, beside a healthy pool of 4 on
    // the same plan and site: 1 of 5 is within 40 %, so it is replaced.
    let p = plan(
        &[
            scoped("web", "c2@DAL", 1, vec![member(0, Health::Failed, 1)]),
            scoped("api", "c2@DAL", 4, healthy(4)),
        ],
        &HashMap::new(),
        &policy(),
    );
    assert_eq!(chosen(&p), vec![(0, Cause::Failed)]);
    assert_eq!(p.delete[0].pool, "web");
    // A provider-wide false failure: three pools of one on one plan and
    // site all read failed. 3 of 3 is an outage: none is replaced, and
    // each pool says so.
    let p = plan(
        &[
            scoped("a", "c2@DAL", 1, vec![member(0, Health::Failed, 1)]),
            scoped("b", "c2@DAL", 1, vec![member(0, Health::Failed, 1)]),
            scoped("c", "c2@DAL", 1, vec![member(0, Health::Failed, 1)]),
        ],
        &HashMap::new(),
        &policy(),
    );
    assert!(p.delete.is_empty(), "{p:?}");
    assert_eq!(p.held.len(), 3, "{p:?}");
    assert!(p.held.iter().all(|h| h.guard == Guard::Unhealthy));
    // The same pools on different sites are counted apart: each is a
    // pool of one alone on its scope, and held (0 of 1 allowed).
    let p = plan(
        &[
            scoped("web", "c2@DAL", 1, vec![member(0, Health::Failed, 1)]),
            scoped("api", "c2@NYC", 4, healthy(4)),
        ],
        &HashMap::new(),
        &policy(),
    );
    assert!(p.delete.is_empty(), "{p:?}");
    // Failures spread over two pools of one scope add up: 2 of 5 is
    // within 40 %, 3 of 5 is not.
    let mut api: Vec<Member> = healthy(4);
    api[0].health = Health::Failed;
    let p = plan(
        &[
            scoped("web", "c2@DAL", 1, vec![member(0, Health::Failed, 1)]),
            scoped("api", "c2@DAL", 4, api.clone()),
        ],
        &HashMap::new(),
        &policy(),
    );
    assert_eq!(p.delete.len(), 2, "{p:?}");
    api[1].health = Health::Failed;
    let p = plan(
        &[
            scoped("web", "c2@DAL", 1, vec![member(0, Health::Failed, 1)]),
            scoped("api", "c2@DAL", 4, api),
        ],
        &HashMap::new(),
        &policy(),
    );
    assert!(p.delete.is_empty(), "{p:?}");
}

#[test]
fn the_budget_and_the_pause_hold_deletions_back() {
    let members: Vec<Member> = (0..20)
        .map(|i| member(i, Health::Ready, i.into()))
        .collect();
    let tight = Policy {
        budget_percent: 10,
        budget_min: 1,
        ..policy()
    };
    // 20 to 10: 10 % of 20 is 2 a period, one used already.
    let used = HashMap::from([("web".to_string(), 1)]);
    let p = plan(&[target(10, members.clone())], &used, &tight);
    assert_eq!(p.delete.len(), 1);
    assert_eq!((p.held[0].guard, p.held[0].count), (Guard::Budget, 9));
    let paused = Policy {
        paused: true,
        ..policy()
    };
    let p = plan(&[target(10, members)], &HashMap::new(), &paused);
    assert!(p.delete.is_empty());
    assert_eq!((p.held[0].guard, p.held[0].count), (Guard::Paused, 10));
    assert_eq!(budget(12, 12, 10, 2), 2);
    assert_eq!(budget(100, 100, 10, 2), 10);
    assert_eq!(budget(0, 7, 10, 2), 2);
}

#[test]
fn a_removed_pool_drains_and_a_leaving_machine_is_not_chosen_twice() {
    let mut members = vec![member(0, Health::Ready, 1), member(1, Health::Ready, 2)];
    members[0].leaving = true;
    let t = Target {
        removed: true,
        count: 0,
        ..target(0, members)
    };
    let p = plan(&[t], &HashMap::new(), &policy());
    assert_eq!(chosen(&p), vec![(1, Cause::PoolRemoved)]);
}

#[test]
fn two_machines_on_one_place_are_surplus_only_beyond_the_count() {
    let mut a = member(0, Health::Ready, 10);
    let b = Member {
        index: 0,
        ..member(0, Health::Ready, 1)
    };
    a.index = 0;
    // Count 3, three members (two on place 0): whole, nothing deleted.
    let p = plan(
        &[target(
            3,
            vec![a.clone(), b.clone(), member(1, Health::Ready, 5)],
        )],
        &HashMap::new(),
        &policy(),
    );
    assert!(p.delete.is_empty());
    // Count 2: the newer of the two goes.
    let p = plan(
        &[target(2, vec![a, b.clone(), member(1, Health::Ready, 5)])],
        &HashMap::new(),
        &policy(),
    );
    assert_eq!(p.delete.len(), 1);
    assert_eq!(p.delete[0].member.machine_id, b.machine_id);
}

#[test]
fn only_positive_evidence_replaces_a_machine() {
    // Every one of these is long past the deadline by the provider's
    // clock, and none is a reason to delete: powered off, in rescue or
    // unknown after months of work; a reinstall of a machine ready once;
    // a deploying machine we did not create (adopted: no creation of ours
    // to count from); one the provider made long ago whose creation we
    // recorded a minute ago.
    let mut members = vec![
        member(0, Health::Dormant, 60 * 24 * 90),
        member(1, Health::Deploying, 60 * 24 * 90),
        member(2, Health::Deploying, 600),
        member(3, Health::Deploying, 600),
        member(4, Health::Ready, 600),
    ];
    members[1].ready_once = true;
    members[2].made_at = None;
    members[3].made_at = Some(Utc::now() - TimeDelta::minutes(1));
    let p = plan(&[target(5, members)], &HashMap::new(), &policy());
    assert_eq!(chosen(&p), vec![], "{p:?}");
    assert!(p.held.is_empty(), "{p:?}");
}

#[test]
fn never_ready_counts_from_our_creation_and_a_failure_is_replaced_whenever() {
    let mut members = vec![
        member(0, Health::Deploying, 45),
        member(1, Health::Failed, 1),
        member(2, Health::Ready, 600),
        member(3, Health::Ready, 600),
        member(4, Health::Ready, 600),
    ];
    // The provider says it was made a minute ago; our creation was
    // recorded 45 minutes ago: the deadline of 30 minutes has passed.
    members[0].created_at = Some(Utc::now() - TimeDelta::minutes(1));
    members[1].ready_once = true;
    let p = plan(&[target(5, members)], &HashMap::new(), &policy());
    assert_eq!(chosen(&p), vec![(0, Cause::NotReady), (1, Cause::Failed)]);
}

#[test]
fn a_dormant_machine_is_the_last_a_lowered_pool_gives_up() {
    let members = vec![
        member(0, Health::Dormant, 600),
        member(1, Health::Ready, 600),
        member(2, Health::Ready, 1),
    ];
    let p = plan(&[target(1, members)], &HashMap::new(), &policy());
    assert_eq!(chosen(&p), vec![(2, Cause::Surplus), (1, Cause::Surplus)]);
}

#[test]
fn among_equals_what_was_adopted_goes_before_what_shepherd_made() {
    let mut members = vec![member(0, Health::Ready, 600), member(1, Health::Ready, 10)];
    // The older one was adopted (no witness of ours): it goes, though the
    // newest would otherwise.
    members[0].adopted = true;
    let p = plan(&[target(1, members)], &HashMap::new(), &policy());
    assert_eq!(chosen(&p), vec![(0, Cause::Surplus)]);
}

/// Among equals, the hourly machine nearest its next billed hour goes
/// first: the least paid time is thrown away.
#[test]
fn among_equals_the_hourly_machine_nearest_its_next_billed_hour_goes() {
    let now = policy().now;
    let hourly = |index: u32, minutes_into_hour: i64, hours: i64| Member {
        billing: Some(crate::provider::Billing::Hourly),
        created_at: Some(now - TimeDelta::hours(hours) - TimeDelta::minutes(minutes_into_hour)),
        ..member(index, Health::Ready, 0)
    };
    // 10, 55 and 30 minutes into their current billed hours: the one at 55
    // (5 minutes left) goes, though it is neither the newest nor the oldest.
    let p = plan(
        &[target(
            2,
            vec![hourly(0, 10, 5), hourly(1, 55, 2), hourly(2, 30, 0)],
        )],
        &HashMap::new(),
        &Policy { now, ..policy() },
    );
    assert_eq!(chosen(&p), vec![(1, Cause::Surplus)]);
    // A failed machine still goes before any healthy one.
    let mut failed = hourly(3, 0, 1);
    failed.health = Health::Failed;
    let p = plan(
        &[target(2, vec![hourly(0, 10, 5), hourly(1, 55, 2), failed])],
        &HashMap::new(),
        &Policy { now, ..policy() },
    );
    assert_eq!(chosen(&p), vec![(3, Cause::Surplus)]);
}

/// A healthy machine paid for to the end of a monthly or yearly term is
/// not surplus before its term ends: held back, with the date, and an
/// hourly one goes instead; a failed prepaid one is not kept for it.
#[test]
fn a_prepaid_machine_stays_to_the_end_of_its_term() {
    let now = policy().now;
    let billed = |index: u32, billing, days: i64| Member {
        billing: Some(billing),
        created_at: Some(now - TimeDelta::days(days)),
        ..member(index, Health::Ready, 0)
    };
    use crate::provider::Billing::{Hourly, Monthly, Yearly};
    // Count 1 of three: the monthly (10 days into its month) and the yearly
    // stay; the hourly goes; one more is wanted gone and held back.
    let p = plan(
        &[target(
            1,
            vec![
                billed(0, Monthly, 10),
                billed(1, Hourly, 1),
                billed(2, Yearly, 40),
            ],
        )],
        &HashMap::new(),
        &Policy { now, ..policy() },
    );
    assert_eq!(chosen(&p), vec![(1, Cause::Surplus)]);
    let held: Vec<_> = p
        .held
        .iter()
        .filter(|h| h.guard == Guard::Prepaid)
        .collect();
    assert_eq!(held.len(), 1, "{p:?}");
    assert_eq!(held[0].count, 1, "{held:?}");
    assert!(held[0].message.contains("deprovision"), "{held:?}");
    // With the pool's prices, what remains of the kept term is valued.
    let mut priced = Policy { now, ..policy() };
    priced.prices.insert(
        "web".into(),
        crate::provider::Price {
            currency: "USD".into(),
            hour: 0.33,
            month: Some(300.0),
            year: Some(3600.0),
        },
    );
    let p = plan(
        &[target(0, vec![billed(0, Monthly, 10)])],
        &HashMap::new(),
        &priced,
    );
    let held = &p.held[0];
    assert_eq!(held.guard, Guard::Prepaid, "{p:?}");
    // 10 days into a month of 28 to 31: about two thirds of 300 USD left.
    let worth: f64 = held
        .message
        .split("worth about ")
        .nth(1)
        .and_then(|w| w.split(' ').next())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("{}", held.message));
    assert!((190.0..=215.0).contains(&worth), "{}", held.message);
    // Its month over (renewed 5 days ago), it is still paid for to the end
    // of the next one; a failed one is let go.
    let mut broken = billed(0, Monthly, 10);
    broken.health = Health::Failed;
    let p = plan(
        &[target(1, vec![broken, billed(1, Monthly, 35)])],
        &HashMap::new(),
        &Policy { now, ..policy() },
    );
    assert_eq!(chosen(&p), vec![(0, Cause::Surplus)]);
}

/// In the last hours of its term a prepaid machine is let go as surplus,
/// before the next term is billed; a month is counted from the creation,
/// not from the last month's end.
#[test]
fn a_prepaid_machine_goes_in_the_last_hours_of_its_term() {
    let now = policy().now;
    let created = now.checked_sub_months(chrono::Months::new(1)).unwrap() + TimeDelta::hours(6);
    let ending = Member {
        billing: Some(crate::provider::Billing::Monthly),
        created_at: Some(created),
        ..member(0, Health::Ready, 0)
    };
    let p = plan(
        &[target(0, vec![ending])],
        &HashMap::new(),
        &Policy { now, ..policy() },
    );
    assert_eq!(chosen(&p), vec![(0, Cause::Surplus)]);
    assert!(p.held.iter().all(|h| h.guard != Guard::Prepaid), "{p:?}");
    let end = crate::provider::Billing::Monthly
        .term_end_after(
            chrono::DateTime::parse_from_rfc3339("2026-01-31T10:00:00Z")
                .unwrap()
                .to_utc(),
            2,
        )
        .unwrap();
    assert_eq!(end.to_rfc3339(), "2026-03-31T10:00:00+00:00");
}
