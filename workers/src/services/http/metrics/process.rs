//! The conventional `process_*` figures of this process, the build it
//! runs, and its database connections.

use super::*;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

/// The conventional `process_*` figures of this process (from `/proc`, on
/// Linux; absent elsewhere) and the build it runs.
pub(super) fn process_metrics(registry: &mut Registry) {
    let build = Family::<BuildLabels, Gauge>::default();
    build
        .get_or_create(&BuildLabels {
            version: env!("CARGO_PKG_VERSION"),
        })
        .set(1);
    registry.register(
        "shepherd_build_info",
        "The shepherd build serving, as a label",
        build,
    );
    let Some(p) = ProcessFigures::read() else {
        return;
    };
    registry.register_with_unit(
        "process_cpu",
        "Total user and system CPU time spent",
        Unit::Seconds,
        ConstCounter::new(p.cpu_seconds),
    );
    registry.register_with_unit(
        "process_resident_memory",
        "Resident memory size",
        Unit::Bytes,
        ConstGauge::new(p.resident_bytes as i64),
    );
    registry.register_with_unit(
        "process_virtual_memory",
        "Virtual memory size",
        Unit::Bytes,
        ConstGauge::new(p.virtual_bytes as i64),
    );
    registry.register_with_unit(
        "process_start_time",
        "Start time of the process since the Unix epoch",
        Unit::Seconds,
        ConstGauge::new(p.start_time_seconds),
    );
    registry.register(
        "process_open_fds",
        "Open file descriptors",
        ConstGauge::new(p.open_fds as i64),
    );
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectionLabels {
    pool: &'static str,
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectionPoolLabel {
    pool: &'static str,
}

/// This process's database connections, per pool (`work`: what its queue
/// and jobs share; `console`: the pages'), open and in use or idle, and the
/// most each may open: what an operator sizes `max_connections` with,
/// read from the pools themselves rather than from the formula. The
/// listener's one connection is apart from both.
pub(super) fn connection_metrics(registry: &mut Registry, pools: &[(&'static str, &PgPool)]) {
    let open = Family::<ConnectionLabels, Gauge>::default();
    let most = Family::<ConnectionPoolLabel, Gauge>::default();
    for (pool, p) in pools {
        // `size` counts what the pool holds, idle or lent out; one being
        // opened is counted when it is.
        let size = i64::from(p.size());
        let idle = i64::try_from(p.num_idle()).unwrap_or(i64::MAX).min(size);
        open.get_or_create(&ConnectionLabels {
            pool,
            state: "in_use",
        })
        .set(size - idle);
        open.get_or_create(&ConnectionLabels {
            pool,
            state: "idle",
        })
        .set(idle);
        most.get_or_create(&ConnectionPoolLabel { pool })
            .set(i64::from(p.options().get_max_connections()));
    }
    registry.register(
        "shepherd_db_connections",
        "Database connections this process holds, by pool and state",
        open,
    );
    registry.register(
        "shepherd_db_connections_max",
        "The most database connections a pool of this process may open",
        most,
    );
}

struct ProcessFigures {
    cpu_seconds: f64,
    resident_bytes: u64,
    virtual_bytes: u64,
    start_time_seconds: f64,
    open_fds: u64,
}

impl ProcessFigures {
    /// `/proc/self/stat` fields 14, 15 (utime, stime), 22 (starttime), 23
    /// (vsize), 24 (rss in pages); the boot time from `/proc/stat`. Clock
    /// ticks and the page size are the Linux defaults on the platforms the
    /// images are built for (100 Hz, 4 KiB).
    fn read() -> Option<ProcessFigures> {
        const TICKS: f64 = 100.0;
        const PAGE: u64 = 4096;
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The command name may hold spaces: fields start after its ')'.
        let rest = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // `rest` starts at field 3 (state).
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        let boot: u64 = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        Some(ProcessFigures {
            cpu_seconds: (field(14)? + field(15)?) as f64 / TICKS,
            start_time_seconds: boot as f64 + field(22)? as f64 / TICKS,
            virtual_bytes: field(23)?,
            resident_bytes: field(24)? * PAGE,
            open_fds,
        })
    }
}
