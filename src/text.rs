//! Text from the provider (and other untrusted places) made fit to keep:
//! bounded in length and free of control characters, which a log line, an
//! event body (Postgres refuses `\u0000` in JSON) or a page would otherwise
//! carry as they came.

/// At most `max` characters of `s`, control characters each shown as
/// U+FFFD, and an ellipsis where it was cut.
pub fn bounded(s: &str, max: usize) -> String {
    let mut out: String = s
        .chars()
        .take(max)
        .map(|c| if c.is_control() { '\u{FFFD}' } else { c })
        .collect();
    if s.chars().nth(max).is_some() {
        out.push('…');
    }
    out
}

/// The most of a provider's message that an event, a log line or a page
/// keeps.
pub const MAX_MESSAGE: usize = 2000;

/// A provider's word for a state, as events keep it.
pub fn bounded_word(s: &str) -> String {
    bounded(s, 64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_and_cleaned() {
        assert_eq!(bounded("on", 64), "on");
        assert_eq!(bounded("a\u{0}b\nc", 64), "a\u{FFFD}b\u{FFFD}c");
        assert_eq!(bounded(&"x".repeat(100), 3), "xxx…");
        assert_eq!(bounded("xxx", 3), "xxx");
    }
}
