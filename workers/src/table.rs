//! Plain aligned tables and event lines for people; scripts use `--json`.

use shepherd::events::StoredEvent;

pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&'static str]) -> Self {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.len()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                if let Some(w) = widths.get_mut(i) {
                    *w = (*w).max(cell.chars().count());
                }
            }
        }
        let line = |cells: Vec<&str>| -> String {
            let mut out = String::new();
            for (i, cell) in cells.iter().enumerate() {
                if i > 0 {
                    out.push_str("  ");
                }
                let pad = widths[i].saturating_sub(cell.chars().count());
                out.push_str(cell);
                if i + 1 < cells.len() {
                    out.push_str(&" ".repeat(pad));
                }
            }
            out.push('\n');
            out
        };
        let mut out = line(self.headers.clone());
        for row in &self.rows {
            out.push_str(&line(row.iter().map(String::as_str).collect()));
        }
        out
    }
}

/// A duration in the largest sensible unit: `3m 20s`, `1h 05m`, `12s`.
pub fn human_duration(d: chrono::TimeDelta) -> String {
    let s = d.num_seconds().max(0);
    if s >= 3600 {
        format!("{}h {:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// One event as a line, or as a JSON object with `--json`.
pub fn print_event(e: &StoredEvent, json: bool) -> anyhow::Result<()> {
    if json {
        println!(
            "{}",
            serde_json::json!({
                "position": e.position,
                "recorded_at": e.recorded_at,
                "stream": e.stream,
                "type": e.event.type_name(),
                "version": e.event.schema_version(),
                "job_id": e.job_id,
                "body": e.event.body(),
            })
        );
    } else {
        println!(
            "{:>8}  {}  {:<24} {:<48} {}",
            e.position,
            e.recorded_at.format("%H:%M:%S%.3f"),
            e.event.type_name(),
            e.stream,
            e.event.body()
        );
    }
    Ok(())
}
