//! The Metal API token as a type that cannot be printed by accident.

use std::fmt;

/// A secret string. `Debug` and `Display` print a placeholder; the value is
/// reachable only through [`ApiToken::expose`], which greps well in review.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken(String);

impl ApiToken {
    pub fn new(token: impl Into<String>) -> Self {
        ApiToken(token.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.trim().is_empty()
    }
}

impl fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiToken(<redacted>)")
    }
}

impl fmt::Display for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_never_formats() {
        let t = ApiToken::new("s3cr3t-token-value");
        assert!(!format!("{t:?}").contains("s3cr3t"));
        assert!(!format!("{t}").contains("s3cr3t"));
        assert!(!format!("{:#?}", Some(&t)).contains("s3cr3t"));
    }
}
