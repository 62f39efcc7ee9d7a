//! Digests: lower-case hex SHA-256, as state files, pre-image names and `sha256:`
//! fingerprints write them.

use sha2::{Digest, Sha256};

/// Lower-case hex SHA-256.
pub fn sha256_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}
