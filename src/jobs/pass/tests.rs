use super::*;

fn device(id: Uuid, witness: Option<&str>) -> Machine {
    Machine {
        id: id.to_string(),
        hostname: Some("shepherd-0123".into()),
        // On a unit shepherd provisions (one of its own for the test).
        unit: Some(id),
        witness: witness.map(str::to_string),
        condition: crate::provider::Condition::Ready,
        created_at: None,
        status: None,
        billing: None,
    }
}

fn fleet(managed: &[Uuid], unassimilated: &[Uuid]) -> Fleet {
    Fleet {
        managed: managed.iter().map(Uuid::to_string).collect(),
        unassimilated: unassimilated.iter().map(Uuid::to_string).collect(),
        ..Fleet::default()
    }
}

#[test]
fn a_machine_assimilated_during_the_listing_is_not_missing() {
    let d = Uuid::new_v4();
    let none = HashSet::new();
    // Made and assimilated after the listing began: absent from it.
    let c = compare(
        &[],
        &fleet(&[], &[]),
        &fleet(&[d], &[]),
        "shepherd-",
        false,
        &none,
    );
    assert!(c.missing.is_empty(), "{c:?}");
    // Managed before the listing and absent from it: missing.
    let c = compare(
        &[],
        &fleet(&[d], &[]),
        &fleet(&[d], &[]),
        "shepherd-",
        false,
        &none,
    );
    assert_eq!(c.missing, vec![d.to_string()]);
}

#[test]
fn a_device_recorded_during_the_listing_is_not_unknown() {
    let d = Uuid::new_v4();
    let none = HashSet::new();
    let listed = [device(d, None)];
    let c = compare(
        &listed,
        &fleet(&[], &[]),
        &fleet(&[], &[d]),
        "shepherd-",
        false,
        &none,
    );
    assert!(c.unknown.is_empty() && c.adopt.is_empty(), "{c:?}");
    let c = compare(
        &listed,
        &fleet(&[], &[]),
        &fleet(&[], &[]),
        "shepherd-",
        false,
        &none,
    );
    assert_eq!(c.unknown, vec![d.to_string()]);
}

#[test]
fn a_prefixed_device_on_no_unit_of_ours_is_a_stranger_that_stops_nothing() {
    let d = Uuid::new_v4();
    let listed = [Machine {
        unit: None,
        ..device(d, Some("abcdef12"))
    }];
    let empty = fleet(&[], &[]);
    let c = compare(&listed, &empty, &empty, "shepherd-", false, &HashSet::new());
    assert!(c.unknown.is_empty() && c.adopt.is_empty(), "{c:?}");
    assert_eq!(c.strangers, vec![d.to_string()]);
}

#[test]
fn assimilate_mode_adopts_only_the_unclaimed_on_a_place_of_ours() {
    let empty = fleet(&[], &[]);
    let bare = Uuid::new_v4();
    let claimed = Uuid::new_v4();
    let stranger = Uuid::new_v4();
    let listed = [
        // On a unit of ours, no witness: what assimilate mode is for.
        device(bare, None),
        // On a unit of ours, with a witness our log does not know: another
        // deployment's, or a copied name. Never adopted.
        device(claimed, Some("deadbeef")),
        // On no unit of ours (`shepherd-staging-web-0-…`): a stranger.
        Machine {
            unit: None,
            ..device(stranger, None)
        },
    ];
    let c = compare(&listed, &empty, &empty, "shepherd-", true, &HashSet::new());
    let adopted: Vec<&str> = c.adopt.iter().map(|a| a.device.as_str()).collect();
    assert_eq!(adopted, vec![bare.to_string()], "{c:?}");
    assert_eq!(c.unknown, vec![claimed.to_string()]);
    assert_eq!(c.strangers, vec![stranger.to_string()]);
}

#[test]
fn a_pass_takes_no_more_of_a_scope_than_its_stock_and_none_of_a_penalised_one() {
    use crate::provider::{PoolReport, PoolStock, Unit};
    let unit = |scope: &str| Unit {
        id: Uuid::new_v4(),
        taken: false,
        provisionable: true,
        scope: Some(scope.to_string()),
        pool: None,
        hint: None,
    };
    let report = |scope: &str, count| PoolReport {
        name: scope.into(),
        plan: "p".into(),
        site: "s".into(),
        scope: scope.into(),
        count: 3,
        taken: 0,
        failed: 0,
        dormant: 0,
        stock: Some(PoolStock {
            offered: true,
            in_stock: true,
            count,
        }),
        machines: 0,
        removed: false,
        price: None,
    };
    let inventory = Inventory {
        // Counted 2, counted 5 but penalised, in stock without a count.
        units: ["a", "a", "a", "b", "b", "c", "c", "c"].map(unit).to_vec(),
        pools: vec![
            report("a", Some(2)),
            report("b", Some(5)),
            report("c", None),
        ],
    };
    let fleet = Fleet {
        penalised_scopes: ["b".to_string()].into_iter().collect(),
        ..Fleet::default()
    };
    let none = HashMap::new();
    let s = select(&inventory, &fleet, None, 100, &none);
    let u = &inventory.units;
    assert_eq!(s.chosen, vec![u[0].id, u[1].id, u[5].id, u[6].id, u[7].id]);
    assert!(s.skipped.contains(&(u[2].id, Skip::BeyondStock)));
    assert!(s.skipped.contains(&(u[3].id, Skip::Penalised)));
    assert_eq!((s.counts.available, s.counts.penalised), (6, 2));
    // The chunk size ends the pass before the stock does.
    let s = select(&inventory, &Fleet::default(), None, 1, &none);
    assert_eq!(s.chosen, vec![u[0].id]);
    assert!(s.skipped.contains(&(u[1].id, Skip::BeyondChunk)));
    // A creation in flight will take a unit of its scope's stock.
    let fleet = Fleet {
        pending: [u[0].id].into_iter().collect(),
        ..Fleet::default()
    };
    let s = select(&inventory, &fleet, None, 100, &none);
    assert_eq!(&s.chosen[..1], &[u[1].id]);
    assert!(s.skipped.contains(&(u[0].id, Skip::InFlight)));
    assert!(s.skipped.contains(&(u[2].id, Skip::BeyondStock)));
}

#[test]
fn only_a_witness_our_log_holds_is_adopted() {
    let (ours, theirs) = (Uuid::new_v4(), Uuid::new_v4());
    let request = Uuid::new_v4().to_string();
    let other = Uuid::new_v4().to_string();
    let listed = [device(ours, Some(&request)), device(theirs, Some(&other))];
    // `our_requests` proved the first one ours (by its id).
    let known: HashSet<String> = [ours.to_string()].into_iter().collect();
    let empty = fleet(&[], &[]);
    let c = compare(&listed, &empty, &empty, "shepherd-", false, &known);
    assert_eq!(
        c.adopt.iter().map(|a| a.device.clone()).collect::<Vec<_>>(),
        vec![ours.to_string()]
    );
    assert_eq!(c.unknown, vec![theirs.to_string()]);
}

/// A place a managed machine of ours stands on, that a lagging listing
/// shows free, is in use: the pool's one lacking machine goes to the
/// place that is really empty.
#[test]
fn a_place_our_records_hold_is_in_use_though_the_listing_shows_it_free() {
    use crate::provider::Unit;
    let place = || Unit {
        id: Uuid::new_v4(),
        taken: false,
        provisionable: true,
        scope: None,
        pool: Some("web".into()),
        hint: None,
    };
    let inventory = Inventory {
        units: vec![place(), place()],
        pools: vec![],
    };
    let (held, empty) = (inventory.units[0].id, inventory.units[1].id);
    let fleet = Fleet {
        held_units: [held].into_iter().collect(),
        ..Fleet::default()
    };
    let lacking: HashMap<String, u32> = [("web".to_string(), 1)].into_iter().collect();
    let s = select(&inventory, &fleet, None, 100, &lacking);
    assert_eq!(s.chosen, vec![empty]);
    assert!(s.skipped.contains(&(held, Skip::InUse)));
    assert_eq!((s.counts.in_use, s.counts.available), (1, 1));
}
