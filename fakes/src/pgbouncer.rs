//! Not a fake: a real PgBouncer, started in transaction mode in front of a
//! real Postgres, for the test and the benchmark that run a cluster behind
//! one. It is configured as docs/operations.md ("Behind PgBouncer") asks
//! of an operator's, so that what passes here passes there.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the pooler forwards to, and how many server connections it may
/// open to it (PgBouncer's `default_pool_size`: the most the cluster can
/// hold on Postgres at once).
#[derive(Debug, Clone)]
pub struct Upstream {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub server_connections: u32,
}

/// A running pgbouncer, stopped when dropped.
pub struct Bouncer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Bouncer {
    /// Starts `bin` listening on `port` of 127.0.0.1, its configuration
    /// and log in `dir`; fails if it does not listen within 10 s.
    pub fn start(
        bin: &Path,
        dir: &Path,
        port: u16,
        upstream: &Upstream,
    ) -> Result<Bouncer, String> {
        // What docs/operations.md asks of an operator's PgBouncer:
        // transaction mode, protocol-level prepared statements carried
        // across server connections, and sqlx's extra_float_digits let
        // through.
        let mut ini = format!(
            "[databases]\n* = host={} port={} user={}\n\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = any\npool_mode = transaction\nmax_prepared_statements = 200\n\
             ignore_startup_parameters = extra_float_digits\n\
             max_client_conn = 1000\ndefault_pool_size = {}\n",
            upstream.host, upstream.port, upstream.user, upstream.server_connections,
        );
        // pgbouncer refuses to run as root (CI does), unless told whom to
        // become.
        use std::os::unix::fs::MetadataExt;
        if std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
            ini.push_str("user = nobody\n");
        }
        let path = dir.join("pgbouncer.ini");
        std::fs::write(&path, ini).map_err(|e| format!("{}: {e}", path.display()))?;
        let log = dir.join("pgbouncer.log");
        let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(bin)
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let mut bouncer = Bouncer { child, port, log };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = bouncer.child.try_wait() {
                return Err(format!(
                    "pgbouncer exited ({status}) before it listened: {}",
                    bouncer.log_text()
                ));
            }
            if started.elapsed() > Duration::from_secs(10) {
                return Err(format!(
                    "pgbouncer did not listen on {port} within 10 s: {}",
                    bouncer.log_text()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(bouncer)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// What pgbouncer logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `url` (`postgres://user@host:port/db`) with the pooler's address in
    /// place of Postgres's.
    pub fn url(&self, url: &str) -> Result<String, String> {
        let (scheme_user, rest) = url
            .split_once('@')
            .ok_or_else(|| format!("{url}: no user@ in the URL"))?;
        let (_, database) = rest
            .split_once('/')
            .ok_or_else(|| format!("{url}: no database in the URL"))?;
        Ok(format!("{scheme_user}@127.0.0.1:{}/{database}", self.port))
    }
}
