//! Names both programs check the same way: the field-naming [`SpecError`] of a NodeSpec
//! or request, safe names (drop-in file names, operation ids) and the drop-in directory.

/// A spec that can not be accepted, with the field it concerns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    /// Field path, e.g. `files[0].mode`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl SpecError {
    /// Builds an error for `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        SpecError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// The directory of NodeSpec drop-ins on the node.
pub const DROPIN_DIR: &str = "/etc/inplaced/node.d";

/// A character of a safe name (`[A-Za-z0-9._-]`): drop-in file names, operation ids.
pub fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// A safe name: 1 to `max` bytes of [`is_name_char`], not starting with `.` (so never `.`,
/// `..` or a hidden file, and never a path) nor `-` (never taken for an option by the
/// tools that get it as an argument). The one rule for every identifier that becomes a
/// file name: drop-in names, operation ids.
pub fn is_safe_name(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && !s.starts_with(['.', '-']) && s.chars().all(is_name_char)
}

/// Validates a drop-in file name: 1-255 bytes of `[A-Za-z0-9._-]`, not starting with `.`
/// or `-`, ending in `.yaml` after a non-empty stem.
pub fn validate_dropin_name(field: &str, name: &str) -> Result<(), SpecError> {
    let ok = is_safe_name(name, 255) && name.len() > ".yaml".len() && name.ends_with(".yaml");
    if ok {
        Ok(())
    } else {
        Err(SpecError::new(
            field,
            format!(
                "{name:?} is not a valid drop-in name; use A-Z a-z 0-9 . _ -, not starting with '.' or '-', ending in .yaml (e.g. 10-tuning.yaml)"
            ),
        ))
    }
}

/// Longest operation id, in bytes.
pub const MAX_OPERATION_ID: usize = 128;

/// Validates an operation id: 1–128 bytes of `[A-Za-z0-9._-]`, not starting with `.` or
/// `-` ([`crate::names::is_safe_name`]). The one check of every RPC and CLI command that
/// takes an operation id (the id names the operation's file in the state directory).
pub fn validate_operation_id(id: &str) -> Result<(), SpecError> {
    validate_operation_id_field("operationId", id)
}

/// [`validate_operation_id`] for the request field `field` (`id` in `GetOperation`).
pub fn validate_operation_id_field(field: &str, id: &str) -> Result<(), SpecError> {
    if crate::names::is_safe_name(id, MAX_OPERATION_ID) {
        return Ok(());
    }
    let shown: String = id.chars().take(40).collect();
    let why = if id.is_empty() {
        "is required".to_string()
    } else if id.len() > MAX_OPERATION_ID {
        format!(
            "{shown:?}... is {} bytes, over {MAX_OPERATION_ID}",
            id.len()
        )
    } else {
        format!("{shown:?} is not a valid operation id")
    };
    Err(SpecError::new(
        field,
        format!(
            "{why}; an operation id is 1-{MAX_OPERATION_ID} characters of A-Z a-z 0-9 . _ -, not starting with '.' or '-'"
        ),
    ))
}
