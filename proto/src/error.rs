//! The crate's one error type: an envelope that breaks the contract.

use std::fmt;

/// `Result` with [`ValidationError`] as the default error.
pub type Result<T, E = ValidationError> = std::result::Result<T, E>;

/// Why an envelope was rejected, and where.
///
/// `field` is a JSON path into the envelope (`event`, `actor.type`,
/// `properties`, or an unknown top-level key verbatim); it is empty when the
/// envelope as a whole is wrong (not a JSON object). Callers that hold many
/// envelopes prefix it with [`ValidationError::at_index`], giving
/// `batch[3].event`. The cloud returns `field` as-is in its 400 body.
///
/// A validation error is never retryable: the same input fails the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    /// JSON path of the offending field; empty for the whole envelope.
    pub field: String,
    /// What is wrong, for a human; does not repeat the field name.
    pub message: String,
}

impl ValidationError {
    /// An error at `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: field.into(), message: message.into() }
    }

    /// Places the error inside element `i` of the array `prefix`:
    /// `event` becomes `batch[3].event`, and an error about the whole
    /// envelope becomes `batch[3]`.
    #[must_use]
    pub fn at_index(self, prefix: &str, i: usize) -> Self {
        self.within(&format!("{prefix}[{i}]"))
    }

    /// Places the error inside the object at `prefix`: `type` becomes
    /// `actor.type`, and an error about the whole value becomes `actor`.
    #[must_use]
    pub fn within(self, prefix: &str) -> Self {
        let field = match (prefix.is_empty(), self.field.is_empty()) {
            (true, _) => self.field,
            (false, true) => prefix.to_owned(),
            (false, false) => format!("{prefix}.{}", self.field),
        };
        Self { field, ..self }
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for ValidationError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_compose_into_json_paths() {
        let e = ValidationError::new("type", "is required").within("actor").at_index("batch", 3);
        assert_eq!(e.field, "batch[3].actor.type");
        assert_eq!(e.to_string(), "batch[3].actor.type: is required");
    }

    #[test]
    fn whole_envelope_errors_take_the_prefix_as_their_path() {
        let e = ValidationError::new("", "must be a JSON object");
        assert_eq!(e.to_string(), "must be a JSON object");
        let e = e.at_index("batch", 0);
        assert_eq!(e.field, "batch[0]");
        assert_eq!(e.to_string(), "batch[0]: must be a JSON object");
    }

    #[test]
    fn empty_prefix_changes_nothing() {
        let e = ValidationError::new("event", "is required").within("");
        assert_eq!(e.field, "event");
    }
}
